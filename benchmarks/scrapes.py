"""Scrape-load runs turned into report rows, and the paired floor comparison.

The floor comparison scrapes gpu-exporter and the floor server
(benchmarks/floor.py, serving the exporter's own plain and gzip bytes) in
turn, one run each per repeat, with the same client: both see the same
machine load, so their ratio says how far the exporter is from what the
machine, kernel and client allow.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.load import LoadResult, scrape_load
from benchmarks.procs import Process


def load_row(r: LoadResult, cpu_per_scrape: float | None) -> dict[str, Any]:
    """One load run as a report row (milliseconds; server CPU in microseconds)."""
    return {
        "scrapers": r.scrapers,
        "gzip": r.gzip,
        "requests": r.requests,
        "p50_ms": r.p50 * 1e3,
        "p99_ms": r.p99 * 1e3,
        "max_ms": r.max * 1e3,
        "bytes": r.body_bytes,
        "server_cpu_us": None if cpu_per_scrape is None else cpu_per_scrape * 1e6,
    }


def _median_row(runs: list[LoadResult], cpu_per_scrape: float | None) -> dict[str, Any]:
    """The run with the median p99, with every run's p99 alongside."""
    mid = sorted(runs, key=lambda r: r.p99)[len(runs) // 2]
    row = load_row(mid, cpu_per_scrape)
    row["p99_repeats_ms"] = [r.p99 * 1e3 for r in runs]
    return row


def scrapes(
    port: int,
    configs: list[tuple[int, bool]],
    requests: int,
    spread: float,
    repeats: int,
    proc: Process | None = None,
    idle_rate: float = 0.0,
) -> list[dict[str, Any]]:
    """Scrape load per (scrapers, gzip), with the server's CPU per scrape when `proc` is given.

    Each configuration runs `repeats` times (requests split between them); the row is
    the repeat with the median p99, so one burst of other work on the machine does not
    decide it. The server CPU is over all repeats.
    """
    out = []
    for n, gz in configs:
        c0, t0 = (proc.cpu(), time.monotonic()) if proc else (0.0, 0.0)
        runs = [scrape_load(port, n, requests // repeats, spread, gz) for _ in range(repeats)]
        cpu = None
        if proc is not None:
            used = proc.cpu() - c0 - idle_rate * (time.monotonic() - t0)
            cpu = max(used, 0.0) / sum(r.requests for r in runs)
        out.append(_median_row(runs, cpu))
    return out


def paired(
    port: int,
    floor_port: int,
    configs: list[tuple[int, bool]],
    load: tuple[int, float, int],
    proc: Process,
    idle_rate: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Exporter and floor rows per (scrapers, gzip), each repeat one run of each in turn.

    load: (requests per configuration, spread seconds, repeats). Exporter rows
    carry `p50_ratio` and `p99_ratio`: the median over repeats of exporter / floor.
    """
    requests, spread, repeats = load
    ours_rows, floor_rows = [], []
    for n, gz in configs:
        ours: list[LoadResult] = []
        floor: list[LoadResult] = []
        cpu = 0.0
        for _ in range(repeats):
            c0, t0 = proc.cpu(), time.monotonic()
            ours.append(scrape_load(port, n, requests // repeats, spread, gz))
            cpu += proc.cpu() - c0 - idle_rate * (time.monotonic() - t0)
            floor.append(scrape_load(floor_port, n, requests // repeats, spread, gz))
        row = _median_row(ours, max(cpu, 0.0) / sum(r.requests for r in ours))
        for stat in ("p50", "p99"):
            ratios = [getattr(o, stat) / getattr(f, stat) for o, f in zip(ours, floor, strict=True)]
            row[f"{stat}_ratio"] = statistics.median(ratios)
        ours_rows.append(row)
        floor_rows.append(_median_row(floor, None))
    return ours_rows, floor_rows


@contextmanager
def floor_server(work: Path, plain: bytes, gzipped: bytes) -> Iterator[int]:
    """The floor server serving these bodies; yields its port."""
    paths = work / "floor.txt", work / "floor.gz"
    paths[0].write_bytes(plain)
    paths[1].write_bytes(gzipped)
    port = procs.free_port()
    argv = [sys.executable, "-m", "benchmarks.floor", *map(str, paths), str(port)]
    with Process(argv, port) as fl:
        fl.wait_http("/metrics", timeout=20)
        yield port
