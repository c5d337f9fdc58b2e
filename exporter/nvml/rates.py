"""Rates from NVML's cumulative counters, the way DCGM publishes some fields.

DCGM serves a few fields (field 449, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL) not as
NVML's cumulative counter but as its change between the last two samples,
divided by the seconds between them and by a field-specific divisor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a cumulative counter: ``value`` at ``t`` seconds."""

    value: float
    t: float


def counter_rate(prev: Sample | None, now: Sample, divisor: float = 1.0) -> float | None:
    """(now - prev) / seconds between them / ``divisor``; None when no rate can be told.

    There is no rate on the first sample, when time did not move forward, or
    when the counter went back (a driver reload or a wrap resets it).
    """
    if prev is None:
        return None
    dt = now.t - prev.t
    dv = now.value - prev.value
    if dt <= 0 or dv < 0:
        return None
    return dv / dt / divisor
