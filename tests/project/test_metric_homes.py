"""docs/architecture.md's "Where a metric lives" table, checked against the code.

Each row names, for one family, the file of its row in a metrics file, of its NVML read,
of its state across cycles and of its rendering; each claim is checked where the code
decides it: the metrics file serves the row, the field table or the module of the
field's source reads it, the derive stage's component for it lives in the file named,
and the family function the renderer dispatches to is defined in the file named.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from exporter.catalog.metricsfile import load
from exporter.derive import xidcatalog
from exporter.derive.accounting import plan
from exporter.derive.stage import Derive
from exporter.exposition import accounting, dcgm
from exporter.nvml.fields import FIELDS, Source
from tools import layout

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "architecture.md"
NONE = "—"
# the read of a field is its entry in the field table, unless its source has a module
READ_BY_SOURCE = {
    Source.FIELD: "exporter/nvml/fields.py",
    Source.CALL: "exporter/nvml/fields.py",
    Source.GPM: "exporter/nvml/fields.py",
    Source.FABRIC: "exporter/nvml/fabric.py",
    Source.P2P: "exporter/nvml/p2p.py",
    Source.XID: "exporter/nvml/xid/events.py",
}
# what the derive stage keeps for a family: attributes of Derive, or what it calls
DERIVED_BY = {
    "DCGM_FI_DEV_XID_ERRORS": [xidcatalog.describe],
    "DCGM_EXP_XID_ERRORS_TOTAL": ["xids"],
    "DCGM_EXP_XID_ERRORS_COUNT": ["xid_window"],
    "DCGM_EXP_CLOCK_EVENTS_COUNT": ["clock_window"],
    "DCGM_EXP_CLOCK_EVENTS_TOTAL": ["clock_totals"],
    "DCGM_EXP_GPU_HEALTH_STATUS": ["health"],
    **{name: ["ledger"] for name in accounting.COUNTERS},
}
MAX_FILES = {"DCGM": 4, "gpu_exporter": 5}


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    section = text.split("## Where a metric lives", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            out.append(cells)
    return out


def _files(cell: str) -> list[str]:
    return [] if cell == NONE else re.findall(r"`([^`]+)`", cell)


def _module_file(obj: object) -> str:
    return str(Path(inspect.getsourcefile(obj)).relative_to(ROOT))  # type: ignore[arg-type]


def _derive_files(family: str) -> set[str]:
    """The files of the derive stage's state for ``family``, with the derive modules they
    import (the stage itself, which only orders the calls, left out)."""
    graph = layout.graph()
    derive = Derive()
    found: set[str] = set()
    for what in DERIVED_BY.get(family, []):
        obj = type(getattr(derive, what)) if isinstance(what, str) else what
        module = inspect.getmodule(obj).__name__  # type: ignore[union-attr]
        assert module in graph["exporter.derive.stage"], f"the derive stage does not use {module}"
        todo = [module]
        while todo:
            m = todo.pop()
            if m in found or m == "exporter.derive.stage":
                continue
            found.add(m)
            todo += [d for d in graph[m] if d.startswith("exporter.derive.")]
    return {str(layout.sources()[m].relative_to(ROOT)) for m in found}


ROWS = _rows()


def test_the_table_has_a_family_of_every_kind():
    families = {r[0].strip("`") for r in ROWS}
    sources = {FIELDS[f].source for f in families if f in FIELDS}
    assert sources >= {Source.FIELD, Source.CALL, Source.GPM, Source.FABRIC, Source.P2P,
                       Source.XID, Source.DERIVED}  # fmt: skip
    assert families & set(accounting.COUNTERS)


@pytest.mark.parametrize("row", ROWS, ids=[r[0].strip("`") for r in ROWS])
def test_a_metric_lives_where_the_table_says(row: list[str]):
    family, row_cell, read_cell, derived_cell, render_cell = row
    family = family.strip("`")
    cells = [_files(c) for c in (row_cell, read_cell, derived_cell, render_cell)]
    files = {f for c in cells for f in c}
    assert all((ROOT / f).is_file() for f in files), files
    limit = MAX_FILES["DCGM" if family.startswith("DCGM") else "gpu_exporter"]
    assert len(files) <= limit, f"{family}'s story is {len(files)} files: {sorted(files)}"
    assert set(cells[2]) == _derive_files(family)
    if family.startswith("DCGM"):
        _dcgm_family(family, *cells)
    else:
        _accounting_family(family, *cells)


def _dcgm_family(family: str, row: list[str], read: list[str], _d: list[str], render: list[str]):
    (csv_file,) = row
    served = {m.field.name for m in load(ROOT / csv_file).metrics}
    assert family in served, f"{csv_file} does not serve {family}"
    field = FIELDS[family]
    expected = READ_BY_SOURCE.get(field.source)
    assert read == ([expected] if expected else []), (family, field.source)
    if expected and expected != "exporter/nvml/fields.py":  # a reader of its own
        module = expected.removesuffix(".py").replace("/", ".")
        assert module in _reachable("exporter.collector"), f"the cycle never runs {module}"
    fn = dcgm.BY_NAME.get(family) or dcgm.SPECIAL.get(field.source) or dcgm.render  # plain values
    assert render == [_module_file(fn)], (family, fn.__name__)


def _accounting_family(family: str, row: list[str], read: list[str], _d: list[str], render):
    assert row == [], "an accounting family has no row in a metrics file"
    assert "exporter/workloads/usage.py" in read  # who held each device: the claims
    assert set(read) <= {"exporter/workloads/usage.py", "exporter/nvml/fields.py"}
    if "exporter/nvml/fields.py" in read:  # utilization and power, read as fields are
        assert set(plan.ALWAYS_READ) <= set(FIELDS)
    assert family in vars(accounting).values()
    assert render == [_module_file(accounting.AccountText)]


def _reachable(start: str) -> set[str]:
    graph = layout.graph()
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen
