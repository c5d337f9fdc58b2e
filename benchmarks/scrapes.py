"""Scrape-load runs turned into report rows, and the paired floor comparison.

    python -m benchmarks.scrapes FLEET.yaml [--scrapers 10] [--plain] [--repeats 7]
                                 [--requests 500] [-- EXPORTER FLAGS...]

runs the floor comparison alone for one configuration (the full suite runs it for
1, 10 and 50 scrapers, gzip and plain) and prints the row as JSON: the way to
measure one change to the scrape path at a time.

The floor comparison scrapes gpu-exporter and the floor server
(benchmarks/floor.py, serving the exporter's own plain and gzip bytes) with
the same client in one run per repeat, their rounds taking turns within each
slot of the run (``load.scrape_pair``): both see the same machine load, so
their ratio says how far the exporter is from what the machine, kernel and
client allow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.load import LoadResult, percentile, scrape_load, scrape_pair
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


def pooled(runs: list[LoadResult], q: float) -> float:
    """The q-th percentile of every scrape of ``runs`` together (seconds)."""
    return percentile([x for r in runs for x in r.latencies], q)


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
    """Exporter and floor rows per (scrapers, gzip); in each repeat their rounds take turns.

    load: (requests per configuration, spread seconds, repeats). Exporter rows
    carry `p50_ratio` and `p99_ratio`: exporter / floor over the scrapes of all repeats
    pooled, so a slow round in any repeat counts and the p99 rests on three times the
    scrapes; `*_ratio_median` is the median of the per-repeat ratios.
    """
    requests, spread, repeats = load
    ours_rows, floor_rows = [], []
    for n, gz in configs:
        ours: list[LoadResult] = []
        floor: list[LoadResult] = []
        cpu = 0.0
        for _ in range(repeats):
            c0, t0 = proc.cpu(), time.monotonic()
            mine, base = scrape_pair((port, floor_port), n, requests // repeats, spread, gz)
            cpu += proc.cpu() - c0 - idle_rate * (time.monotonic() - t0)
            ours.append(mine)
            floor.append(base)
        row = _median_row(ours, max(cpu, 0.0) / sum(r.requests for r in ours))
        floor_row = _median_row(floor, None)
        for stat, q in (("p50", 50), ("p99", 99)):
            mine, base = pooled(ours, q), pooled(floor, q)
            row[f"{stat}_pooled_ms"], floor_row[f"{stat}_pooled_ms"] = mine * 1e3, base * 1e3
            row[f"{stat}_ratio"] = mine / base
            ratios = [getattr(o, stat) / getattr(f, stat) for o, f in zip(ours, floor, strict=True)]
            row[f"{stat}_ratio_median"] = statistics.median(ratios)
        ours_rows.append(row)
        floor_rows.append(floor_row)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scrapes", description=__doc__)
    p.add_argument("fleet", type=Path, help="fleet YAML file")
    p.add_argument("--scrapers", type=int, default=10)
    p.add_argument("--plain", action="store_true", help="no Accept-Encoding: gzip")
    p.add_argument("--repeats", type=int, default=7, help="runs, each of both servers")
    p.add_argument("--requests", type=int, default=500, help="per run")
    p.add_argument("--interval-ms", type=int, default=1000, help="the exporter's -c")
    p.add_argument("flags", nargs="*", help="more exporter flags (after --)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpu-exporter-scrapes-"))
    with procs.ours(a.fleet, a.interval_ms, work / "exporter.log", a.flags) as ours:
        ours.wait_http("/ready")
        time.sleep(3.0)
        idle = procs.cpu_rate(ours, 5.0)
        with floor_server(work, *ours.bodies()) as floor_port:
            load = (a.requests * a.repeats, 2.0, a.repeats)
            rows, floor = paired(
                ours.port, floor_port, [(a.scrapers, not a.plain)], load, ours, idle
            )
    print(json.dumps({"exporter": rows[0], "floor": floor[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
