"""The metrics file: dcgm-exporter's CSV format (``FIELD, type, help``) to metric specs.

Parsing is strict where a mistake would silently lose data (wrong column count,
unknown type, unknown field name: a :class:`CatalogError` naming file and line)
and lenient where dcgm-exporter is (``#`` comments, padding spaces, blank lines).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from exporter.files import ConfigFileError, read_config_file
from exporter.nvml.fields import FIELDS, UNSERVED, Field

MAX_BYTES = 1 << 20
"""Largest metrics file read, bytes."""
TYPES = ("gauge", "counter", "label", "histogram", "summary")


class CatalogError(ValueError):
    """A metrics file that cannot be used; the message names file, line and fix."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One enabled row of the metrics file, joined with how NVML serves it."""

    name: str
    type: str
    help: str
    line: int
    field: Field


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row the exporter cannot serve, with the reason logged once at startup."""

    name: str
    line: int
    reason: str


@dataclass(frozen=True, slots=True)
class Catalog:
    """The parsed metrics file: metric rows, label rows, and rows skipped with a reason."""

    path: str
    metrics: tuple[MetricSpec, ...]
    labels: tuple[MetricSpec, ...]
    skipped: tuple[Skipped, ...]

    def names(self) -> frozenset[str]:
        return frozenset(m.name for m in self.metrics + self.labels)


def load(path: str | Path) -> Catalog:
    """Read and validate a metrics file; raises :class:`CatalogError` on any malformed row."""
    try:  # a regular file of bounded size: a FIFO or /dev/zero is refused at once
        text = read_config_file(str(path), "metrics file", MAX_BYTES)
    except ConfigFileError as e:
        raise CatalogError(f"{e}; pass a readable CSV with -f/--collectors") from None
    return parse(text, str(path))


def parse(text: str, path: str = "<metrics>") -> Catalog:
    """Parse metrics-file text; ``path`` only names the source in error messages."""
    metrics: list[MetricSpec] = []
    labels: list[MetricSpec] = []
    skipped: list[Skipped] = []
    seen: dict[str, int] = {}
    reader = csv.reader(io.StringIO(text), skipinitialspace=True, strict=True)
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            spec = _row(row, path, lineno)
            if spec.name in seen:
                raise CatalogError(
                    f"{path}:{lineno}: {spec.name} is already listed on line {seen[spec.name]}; "
                    "keep one row per field"
                )
            seen[spec.name] = lineno
            if isinstance(spec, Skipped):
                skipped.append(spec)
            elif spec.type == "label":
                labels.append(spec)
            else:
                metrics.append(spec)
    except csv.Error as e:
        raise CatalogError(f"{path}:{reader.line_num}: {e}; fix the CSV quoting") from None
    return Catalog(path, tuple(metrics), tuple(labels), tuple(skipped))


def _row(row: list[str], path: str, lineno: int) -> MetricSpec | Skipped:
    fields = [c.strip() for c in row]
    if len(fields) != 3:
        raise CatalogError(
            f"{path}:{lineno}: expected 3 comma-separated fields (FIELD, type, help), "
            f"found {len(fields)}; quote a help text that contains commas"
        )
    name, typ, help_text = fields
    if not name:
        raise CatalogError(f"{path}:{lineno}: the field name is empty")
    if typ not in TYPES:
        raise CatalogError(
            f"{path}:{lineno}: {name}: unknown metric type {typ!r}; use one of {', '.join(TYPES)}"
        )
    field = FIELDS.get(name)
    if field is None:
        if name in UNSERVED:
            return Skipped(name, lineno, UNSERVED[name])
        raise CatalogError(
            f"{path}:{lineno}: unknown field {name!r}; use a DCGM field name such as "
            "DCGM_FI_DEV_GPU_UTIL (docs/compatibility.md lists every field this exporter knows)"
        )
    if typ in ("histogram", "summary"):
        return Skipped(name, lineno, f"type {typ} has no NVML source; list it as gauge or counter")
    if (typ == "label") != field.is_label:
        want = "label" if field.is_label else "gauge or counter"
        raise CatalogError(f"{path}:{lineno}: {name} is a {want} field, not {typ}")
    return MetricSpec(name, typ, help_text, lineno, field)
