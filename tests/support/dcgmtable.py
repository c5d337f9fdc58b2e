"""DCGM's XID health grading read from DCGM's own C++ (tests/fixtures/dcgm), not from the exporter.

The fixtures are DcgmHealthWatch::BuildXidMappings copied verbatim from NVIDIA/DCGM at tags
v4.5.3 and v4.6.0 (each file's first line names its commit). This module parses the C++
initialisers itself, so the exporter's table (exporter/derive/dcgm-xids.csv) is checked
against an independent reading, and the simulated node's expectations come from here.
"""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
RESULTS = {"WARN": 10, "FAIL": 20}
# '{ 79, { DCGM_HEALTH_RESULT_FAIL, DCGM_HEALTH_WATCH_ALL, <message>, DCGM_FR_X[, ARCH] } }'
_ENTRY = re.compile(
    r"\{\s*(\d+)\s*,\s*\{\s*DCGM_HEALTH_RESULT_(\w+)\s*,\s*DCGM_HEALTH_WATCH_(\w+)\s*,"
    r"\s*(?:\"[^\"]*\"|\w+)\s*,\s*(DCGM_FR_\w+)\s*(?:,\s*DCGM_CHIP_ARCH_(\w+)\s*)?\}\s*\}"
)
# a table's start: 'm_devastatingXids =' (watch ALL) or 'm_subsystemXids[DCGM_HEALTH_WATCH_MEM] ='
_TABLE = re.compile(r"m_devastatingXids\s*=|m_subsystemXids\[DCGM_HEALTH_WATCH_(\w+)\]\s*=")

Grade = tuple[str, int, str, str]  # watch, result (10 warn, 20 fail), code, arch ("" any)


def commit(tag: str) -> str:
    """The DCGM commit the fixture of ``tag`` was copied from (its first line)."""
    first = (FIXTURES / f"BuildXidMappings-{tag}.cpp").read_text().splitlines()[0]
    found = re.search(r"commit ([0-9a-f]{40})", first)
    assert found, first
    return found.group(1)


def table(tag: str) -> dict[int, Grade]:
    """XID -> (watch, result, code, arch) as BuildXidMappings of DCGM ``tag`` fills it."""
    text = re.sub(r"//[^\n]*", "", (FIXTURES / f"BuildXidMappings-{tag}.cpp").read_text())
    starts = list(_TABLE.finditer(text))
    out: dict[int, Grade] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        table_watch = start.group(1) or "ALL"
        for m in _ENTRY.finditer(text, start.end(), end):
            xid, result, watch, code, arch = m.groups()
            assert watch == table_watch, (tag, xid, watch, table_watch)
            assert int(xid) not in out, (tag, xid)
            out[int(xid)] = (watch, RESULTS[result], code, arch or "")
    assert len(starts) == 7 and out, f"{tag}: the fixture's shape changed"
    return out
