"""The metrics file: dcgm-exporter's CSV format (``FIELD, type, help``) to metric specs.

Parsing is strict where a mistake would silently lose data (wrong column count,
unknown type, a name that cannot be a metric name, a name DCGM does not know,
a file with no rows: a :class:`CatalogError` naming file and line) and lenient
where dcgm-exporter is (``#`` comments, padding spaces, blank lines). Each row is
served under its name as written, as dcgm-exporter serves it (a 1.x name such as
``dcgm_gpu_temp`` stays that name; -o renames labels only). A DCGM field NVML
cannot serve is skipped with its reason, so NVIDIA's own CSVs load. A name listed
twice (NVIDIA's 1.x CSV lists two PCIe rows twice) is served once, as its later row
says; the catalog names both lines.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from exporter.catalog.fieldnames import dcgm_names, suggest
from exporter.catalog.unserved import UNSERVED
from exporter.config.files import ConfigFileError, read_config_file
from exporter.nvml.fields import DCGM46, FIELDS, Field

TYPES = ("gauge", "counter", "label", "histogram", "summary")
MAX_BYTES = 1 << 20  # a metrics file larger than 1 MiB is refused
MAX_ROWS = 5000  # rows (DCGM knows about a thousand fields)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Throughputs over the last interval (gauges by nature) that NVIDIA's default CSV of
# dcgm-exporter 4.8.2 types `counter`; the file's TYPE is kept (docs/compatibility.md).
RATES = frozenset(
    {
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    }
)
NO_SOURCE = "a DCGM field NVML cannot serve (docs/compatibility.md lists the fields served)"


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


class _Pair(NamedTuple):
    name: str
    reason: str


class Skipped(_Pair):
    """A row the exporter does not serve: the pair (field name, reason), and its ``line``."""

    line: int

    def __new__(cls, name: str, line: int, reason: str) -> Skipped:
        self = super().__new__(cls, name, reason)
        self.line = line
        return self


@dataclass(frozen=True, slots=True)
class Catalog:
    """The parsed metrics file: metric rows, label rows, and rows skipped with a reason."""

    path: str
    metrics: tuple[MetricSpec, ...]
    labels: tuple[MetricSpec, ...]
    skipped: tuple[Skipped, ...]
    old_names: bool = False  # -o: labels under dcgm-exporter 1.x names (metric names as written)
    # names listed more than once: (name, earlier line, later line)
    duplicates: tuple[tuple[str, int, int], ...] = ()
    dcgm47: bool = False  # names mean DCGM 4.7's fields, not DCGM 4.6's aliases (fields.DCGM46)

    def names(self) -> frozenset[str]:
        return frozenset(m.name for m in self.metrics + self.labels)

    def rates_typed_counter(self) -> tuple[str, ...]:
        """Served names of the throughputs (``RATES``) this file types ``counter``."""
        return tuple(m.name for m in self.metrics if m.type == "counter" and m.field.name in RATES)


@cache
def names_1x() -> dict[str, str]:
    """dcgm-exporter 1.x name -> DCGM field name (names-1x.csv, shipped in the package)."""
    text = (resources.files("exporter.catalog") / "names-1x.csv").read_text(encoding="utf-8")
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    return {r[0]: r[1] for r in rows if r and not r[0].startswith("#")}


def load(path: str | Path, old_names: bool = False, dcgm47: bool = False) -> Catalog:
    """Read and validate a metrics file; raises :class:`CatalogError` on any malformed row.

    ``old_names`` (-o) is kept with the catalog; rows are served under their names as written.
    ``dcgm47``: a name DCGM 4.6 defines as an alias and DCGM 4.7 as a field of its own is
    read as DCGM 4.7's (the release's ``Release.dcgm47``).
    """
    try:  # a regular file of bounded size: a FIFO or /dev/zero is refused at once
        text = read_config_file(str(path), "metrics file", MAX_BYTES)
    except ConfigFileError as e:
        raise CatalogError(f"{e} (-f/--collectors)") from None
    return parse(text, str(path), old_names, dcgm47)


def parse(
    text: str, path: str = "<metrics>", old_names: bool = False, dcgm47: bool = False
) -> Catalog:
    """Parse metrics-file text; ``path`` only names the source in error messages.

    A name listed again replaces its earlier row in place (type, help): the later
    row wins, as a later setting does in a config file, and the name stays one
    family, one series per device. Serving both rows would
    publish the same series twice, which Prometheus counts as duplicate samples.
    """
    entries: dict[str, MetricSpec | Skipped] = {}  # by name, in the order first listed
    duplicates: list[tuple[str, int, int]] = []
    rows = 0
    reader = csv.reader(io.StringIO(text), skipinitialspace=True, strict=True)
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if rows >= MAX_ROWS:
                raise CatalogError(f"{path}:{lineno}: more than {MAX_ROWS} rows; list fewer")
            rows += 1
            spec = _row(row, path, lineno, dcgm47)
            key = spec.name  # as written: two names of one field are two families
            earlier = entries.get(key)
            if earlier is not None:
                duplicates.append((row[0].strip(), earlier.line, lineno))
            entries[key] = spec
    except csv.Error as e:
        raise CatalogError(f"{path}:{reader.line_num}: {e}; fix the CSV quoting") from None
    if not entries:
        raise CatalogError(
            f"{path}: the metrics file has no rows; list fields as FIELD, type, help "
            "(the shipped metrics.csv is an example)"
        )
    metrics: list[MetricSpec] = []
    labels: list[MetricSpec] = []
    skipped: list[Skipped] = []
    for spec in entries.values():
        if isinstance(spec, Skipped):
            skipped.append(spec)
        elif spec.type == "label":
            labels.append(spec)
        else:
            metrics.append(spec)
    return Catalog(
        path, tuple(metrics), tuple(labels), tuple(skipped), old_names, tuple(duplicates), dcgm47
    )


def _row(row: list[str], path: str, lineno: int, dcgm47: bool) -> MetricSpec | Skipped:
    fields = [c.strip() for c in row]
    if len(fields) != 3:
        raise CatalogError(
            f"{path}:{lineno}: expected 3 comma-separated fields (FIELD, type, help), "
            f"found {len(fields)}; quote a help text that contains commas"
        )
    name, typ, help_text = fields
    if not name:
        raise CatalogError(f"{path}:{lineno}: the field name is empty")
    if not _NAME.fullmatch(name):
        raise CatalogError(
            f"{path}:{lineno}: {name[:60]!r} is not a field name; use a DCGM field name "
            "such as DCGM_FI_DEV_GPU_UTIL"
        )
    if typ not in TYPES:
        raise CatalogError(
            f"{path}:{lineno}: {name}: unknown metric type {typ!r}; use one of {', '.join(TYPES)}"
        )
    field = None if dcgm47 else DCGM46.get(name)  # DCGM 4.6's reading of a 4.7 name
    field = field or FIELDS.get(names_1x().get(name, name))
    if field is None:
        return Skipped(name, lineno, _not_served(name, path, lineno))
    if typ in ("histogram", "summary"):
        return Skipped(name, lineno, f"type {typ} has no NVML source; list it as gauge or counter")
    if (typ == "label") != field.is_label:
        want = "label" if field.is_label else "gauge or counter"
        return Skipped(name, lineno, f"served as a {want} field here; list it as {want}")
    return MetricSpec(name, typ, help_text, lineno, field)


def _not_served(name: str, path: str, lineno: int) -> str:
    """Why a known name is not served; a :class:`CatalogError` for a name DCGM does not know."""
    if name in UNSERVED:
        return UNSERVED[name]
    if name in dcgm_names():
        return NO_SOURCE
    near = suggest(name, known_names())
    hint = f"did you mean {near}? " if near else ""
    raise CatalogError(
        f"{path}:{lineno}: {name[:80]!r} is not a DCGM field, a dcgm-exporter 1.x name or a "
        f"DCGM_EXP_* family; {hint}fix or remove the row (docs/compatibility.md lists the fields)"
    )


@cache
def known_names() -> frozenset[str]:
    """Every name a metrics-file row may give: DCGM's fields, the 1.x names, ours."""
    return dcgm_names() | frozenset(names_1x()) | frozenset(FIELDS) | frozenset(UNSERVED)
