"""DCGM's health grading of XIDs, per DCGM release (dcgm-xids.csv beside this module).

Each row is one XID that DCGM's health watch records, as BuildXidMappings in DCGM's
DcgmHealthWatch.cpp gives it: the watch it fails or warns, the result and the DCGM error
code; the file's header names the source, tags and commits. An XID a release does not
list leaves that release's health alone.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

RESULTS = ("WARN", "FAIL")
VOLTA = "VOLTA"
DEFAULT_DCGM = "4.6.0"


@dataclass(frozen=True, slots=True)
class XidGrade:
    """How one DCGM release grades one XID."""

    watch: str  # DCGM health watch: ALL, MEM, PCIE, THERMAL, POWER, NVLINK, INFOROM
    result: str  # WARN or FAIL
    code: str  # DCGM error code (DCGM_FR_*)
    arch: str = ""  # the only chip architecture graded (VOLTA); "": every one


def parse(text: str) -> dict[str, dict[int, XidGrade]]:
    """DCGM release -> XID -> grade, from a dcgm-xids.csv text; raises ValueError naming
    the data row of a bad row."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    out: dict[str, dict[int, XidGrade]] = {}
    for n, row in enumerate(csv.reader(io.StringIO("\n".join(lines[1:]))), start=1):
        ok = len(row) == 6 and row[1].isdigit() and row[3] in RESULTS and row[5] in ("", VOLTA)
        if not ok:
            want = "dcgm,xid,watch,result,code,arch"
            raise ValueError(f"dcgm-xids.csv data row {n}: expected '{want}'")
        rel = out.setdefault(row[0], {})
        if int(row[1]) in rel:
            raise ValueError(f"dcgm-xids.csv data row {n}: XID {row[1]} listed twice for {row[0]}")
        rel[int(row[1])] = XidGrade(row[2], row[3], row[4], row[5])
    return out


@cache
def releases() -> dict[str, dict[int, XidGrade]]:
    """Every DCGM release's table (read once from the package)."""
    text = (resources.files("exporter.derive") / "dcgm-xids.csv").read_text(encoding="utf-8")
    return parse(text)


def grade(xid: int, dcgm: str = DEFAULT_DCGM, volta: bool = False) -> XidGrade | None:
    """How DCGM ``dcgm`` grades ``xid`` on a GPU (``volta``: a Volta chip); None: ignored."""
    g = releases()[dcgm].get(xid)
    if g is None or (g.arch == VOLTA and not volta):
        return None
    return g
