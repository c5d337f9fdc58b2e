"""NVIDIA's Xid catalog: a short description and the source of every published XID code.

The data is ``xids.csv`` in this package (codes 0-172; see its header for where
the facts come from). ``describe`` gives the ``err_msg`` label text of
DCGM_FI_DEV_XID_ERRORS; ``source`` says where an XID comes from (application,
memory, nvlink, ...); the GPU health status grades XIDs by DCGM's table instead
(dcgmxids.py).
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

UNKNOWN = "Unknown XID"
SOURCES = frozenset(
    {
        "application",
        "driver",
        "memory",
        "nvlink",
        "pcie",
        "power",
        "mcu",
        "inforom",
        "video",
        "display",
        "none",
        "unused",
    }
)


@dataclass(frozen=True, slots=True)
class Xid:
    """One catalog row."""

    code: int
    description: str
    source: str


@functools.cache
def catalog() -> dict[int, Xid]:
    """Every catalog row by XID code (read once from the package)."""
    text = resources.files("exporter.derive").joinpath("xids.csv").read_text(encoding="utf-8")
    return parse(text)


def parse(text: str) -> dict[int, Xid]:
    """Rows of an xids.csv text; raises ValueError naming the line of a bad row."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    out: dict[int, Xid] = {}
    for n, row in enumerate(csv.reader(io.StringIO("\n".join(lines[1:]))), start=2):
        if len(row) != 3 or not row[0].isdigit() or row[2] not in SOURCES:
            raise ValueError(f"xids.csv data row {n - 1}: expected 'xid,description,source'")
        code = int(row[0])
        if code in out:
            raise ValueError(f"xids.csv data row {n - 1}: XID {code} listed twice")
        out[code] = Xid(code, row[1].strip(), row[2])
    return out


def describe(xid: int) -> str:
    """The short description of an XID code (``err_msg``); "Unknown XID" if not listed."""
    row = catalog().get(xid)
    return row.description if row else UNKNOWN


def source(xid: int) -> str:
    """Where an XID comes from (a name in SOURCES); "driver" for codes not listed."""
    row = catalog().get(xid)
    return row.source if row else "driver"
