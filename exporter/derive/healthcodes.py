"""Severity and category of a DCGM health error code (exporter/derive/dcgm-errors.csv).

dcgm-exporter 4.8.3 and later add them to DCGM_EXP_GPU_HEALTH_STATUS as
``health_error_severity`` and ``health_error_category``, from DCGM's table of error
codes; the file copies that table's rows for the codes the health status can carry.
"""

from __future__ import annotations

import csv
import io
from functools import cache
from importlib import resources

UNKNOWN = ("UNKNOWN", "NONE")
"""What a code missing from the table is labelled."""


@cache
def table() -> dict[str, tuple[str, str]]:
    """DCGM error code -> (severity, category)."""
    text = (resources.files("exporter.derive") / "dcgm-errors.csv").read_text(encoding="utf-8")
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    rows = [r for r in rows if not r[0].startswith("#")][1:]  # the first row names the columns
    return {code.strip(): (sev.strip(), cat.strip()) for code, sev, cat in rows}


def grade(code: str) -> tuple[str, str]:
    """(health_error_severity, health_error_category) of a DCGM error code."""
    return table().get(code, UNKNOWN)
