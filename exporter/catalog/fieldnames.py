"""The names DCGM knows (dcgm-fields.csv): which a metrics file may list, and suggestions.

A metrics-file row names a DCGM field, a dcgm-exporter 1.x name or a DCGM_EXP_* family;
dcgm-exporter refuses any other name ("could not find DCGM field") and so does this
exporter, suggesting the nearest known name. Only the standard library is imported here,
so that exporter.nvml.fields can read the aliases without an import cycle.
"""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Iterable
from functools import cache
from importlib import resources

SUGGEST_CUTOFF = 0.75  # difflib's similarity (0-1) a suggestion must reach
MAX_NAME = 128  # characters of a name compared (a longer one gets no suggestion)


@cache
def _rows() -> tuple[tuple[str, str], ...]:
    text = (resources.files("exporter.catalog") / "dcgm-fields.csv").read_text(encoding="utf-8")
    out = []
    header = True
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or row[0].startswith("#"):
            continue
        if header:  # the first row names the columns
            header = False
            continue
        out.append((row[0].strip(), row[1].strip() if len(row) > 1 else ""))
    return tuple(out)


@cache
def dcgm_names() -> frozenset[str]:
    """Every DCGM field name, DCGM 4.6's aliases included."""
    return frozenset(name for name, _ in _rows())


@cache
def aliases() -> dict[str, str]:
    """DCGM 4.6 alias -> the field name whose ID it shares (aliases this exporter serves)."""
    return {name: same for name, same in _rows() if same}


def suggest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest to ``name`` (case ignored), or None when none is near."""
    if len(name) > MAX_NAME:
        return None
    by_upper = {k.upper(): k for k in known}
    hits = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=SUGGEST_CUTOFF)
    return by_upper[hits[0]] if hits else None
