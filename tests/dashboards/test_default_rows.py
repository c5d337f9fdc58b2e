"""The default metrics file against what reads it: dcgm-exporter's default rows plus exactly
the rows the shipped alerts, recording rules and dashboards read, each extra row named in
docs/compatibility.md with what reads it; the extended file has every row the exporter can
serve."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from exporter.catalog.fieldnames import aliases
from exporter.catalog.metricsfile import load
from exporter.catalog.renames import renames
from exporter.nvml.fields import FIELDS

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "exporter" / "catalog"
NVIDIA_DEFAULT = REPO / "tests" / "fixtures" / "csv" / "nvidia-4.8.2" / "default-counters.csv"
NAME = re.compile(r"\b(DCGM_(?:FI|EXP)_\w+)")
OLD = {r.new: r.old for r in renames()}  # a DCGM 4.7 name -> dcgm-exporter 4.8's
# older names of fields served under their current name too (never in a shipped file)
ALIASES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"}
ALIASES |= set(aliases())  # DCGM 4.6 names of fields the extended file lists already


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def readers() -> dict[str, list[str]]:
    """Each DCGM family an alert, recording rule or dashboard reads (dcgm-exporter 4.8's
    name), with what reads it: ``alert X``, ``rule X`` or ``<dashboard>: <panel>``."""
    out: dict[str, list[str]] = {}

    def add(expr: str, who: str) -> None:
        for name in NAME.findall(expr):
            found = out.setdefault(OLD.get(name, name), [])
            if who not in found:
                found.append(who)

    for src in sorted((REPO / "alerts" / "src").glob("*.yaml")):
        for group in yaml.safe_load(src.read_text())["groups"]:
            for rule in group["rules"]:
                who = f"alert {rule['alert']}" if "alert" in rule else f"rule {rule['record']}"
                add(rule.get("expr", ""), who)
    for path in sorted((REPO / "dashboards").glob("*.json")):
        data = json.loads(path.read_text())
        for panel in _panels(data["panels"]):
            for query in panel.get("targets", []):
                add(query["expr"], f"{path.stem}: {panel['title']}")
        for var in data["templating"]["list"]:
            if var["type"] == "query":
                add(var["query"], f"{path.stem}: variable {var['name']}")
    return out


def _rows(path: Path) -> set[str]:
    """The DCGM fields a metrics file serves (rows, label rows included; no comments)."""
    catalog = load(path)
    assert not catalog.skipped, [s.name for s in catalog.skipped]
    return {m.name for m in catalog.metrics} | {m.name for m in catalog.labels}


def _nvidia_default() -> set[str]:
    """dcgm-exporter's default rows that NVML can serve (its vGPU licence row cannot)."""
    catalog = load(NVIDIA_DEFAULT)
    return {m.name for m in catalog.metrics} | {m.name for m in catalog.labels}


def _documented() -> dict[str, str]:
    text = (REPO / "docs" / "compatibility.md").read_text()
    section = text.split("## The default metrics file\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(DCGM_\w+)` \| (.+) \|$", section, re.M))


def test_every_family_read_is_served_by_default() -> None:
    default = _rows(CATALOG / "metrics.csv")
    missing = {name: who for name, who in readers().items() if name not in default}
    assert not missing, f"read but not in the default metrics file: {missing}"


def test_the_default_serves_nothing_unread_beyond_dcgm_exporters_default() -> None:
    default, nvidia, read = _rows(CATALOG / "metrics.csv"), _nvidia_default(), readers()
    assert nvidia <= default, f"dcgm-exporter's default rows missing: {nvidia - default}"
    unread = default - nvidia - read.keys()
    assert not unread, f"in the default, read by nothing, not in dcgm-exporter's: {unread}"


def test_each_extra_row_is_named_with_what_reads_it() -> None:
    default, nvidia, read = _rows(CATALOG / "metrics.csv"), _nvidia_default(), readers()
    expected = {name: ", ".join(read[name]) for name in sorted(default - nvidia)}
    table = "\n".join(f"| `{name}` | {who} |" for name, who in expected.items())
    assert _documented() == expected, f"docs/compatibility.md's table should be:\n{table}"


def test_the_release_files_have_the_defaults_rows() -> None:
    """4.8.2's file: the same rows; 4.9's: the same under DCGM 4.7 names, plus the
    framebuffer capacity that dcgm-exporter 4.9 collects by default."""
    default = _rows(CATALOG / "metrics.csv")
    assert _rows(CATALOG / "metrics-4.8.2.csv") == default
    renamed = {OLD.get(name, name) for name in _rows(CATALOG / "metrics-4.9.csv")}
    assert renamed == default | {"DCGM_FI_DEV_FB_CAPACITY_BYTES"}


def test_the_extended_file_has_every_row_the_exporter_serves() -> None:
    new_names = set(OLD) - set(OLD.values())
    servable = {n for n in FIELDS if n not in new_names and n not in ALIASES}
    extended = _rows(CATALOG / "metrics-extended.csv")
    assert extended == servable
    assert _rows(CATALOG / "metrics.csv") <= extended
