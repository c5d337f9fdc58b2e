"""Formatting helpers and result lookups shared by the report's sections."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.stats import fit

Add = Callable[[str], None]


def _f(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:,.{digits}f}"


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _verdict(ok: bool | None) -> str:
    return "reported" if ok is None else ("**met**" if ok else "**missed**")


def _scrape(rows: list[dict[str, Any]], n: int, gz: bool) -> dict[str, Any] | None:
    for r in rows:
        if r["scrapers"] == n and r["gzip"] == gz:
            return r
    return None


def _growth(samples: list[list[float]]) -> tuple[float, float]:
    """(MiB from first to last sample, slope in MiB per 1000 cycles)."""
    if len(samples) < 2:
        return 0.0, 0.0
    xs = [c / 1000 for c, _ in samples]
    ys = [m for _, m in samples]
    return ys[-1] - ys[0], fit(xs, ys)[1]


def _pod_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The target node without -k (0 pods), then with each pod count, in order."""
    pods = res.get("pods") or {}
    if not pods:
        return []
    t = res["target"]
    base = res["process"][t]
    body = res["cycle"][t]
    zero = {
        "pods": 0,
        "rss_mib": base["rss_mib"],
        "cpu_1s": base["cpu_1s"],
        "series": body["series"],
        "attributed": 0,
        "plain_bytes": body["plain_bytes"],
        "gzip_bytes": body["gzip_bytes"],
        "scrapes": base["scrapes"],
    }
    return [zero, *sorted(pods.values(), key=lambda r: r["pods"])]


def _net(c: dict[str, Any]) -> float:
    """Own CPU plus the modelled driver cost: what the cycle would cost on a real node."""
    return c["net_ms"]
