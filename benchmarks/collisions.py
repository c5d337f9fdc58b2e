"""Scrapes that meet a collection cycle, apart from those that do not.

    python -m benchmarks.collisions FLEET.yaml [--interval-ms 200] [--rounds 1200]

A scrape p99 over a few hundred requests depends on whether a handful of rounds met
the cycle, so it moves a lot between runs. This benchmark looks at those rounds
directly: rounds of N simultaneous gzip scrapes at random phases, and for each round
whether the exporter's NVML worker thread ran (its CPU time moved) between the first
request and the last answer. A short interval (200 ms by default) makes about one
round in ten meet a cycle, so a run has enough of them to compare. Prints one JSON
object: latency percentiles (ms) of scrapes in rounds that met a cycle and in the
others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.load import Scraper, paced, percentile

GAP_S = 0.037  # each round's slot; it starts at a random point of it (load.paced)


def worker_tid(pid: int, seconds: float = 3.0) -> int:
    """The thread of ``pid`` (not the main one) that used the most CPU over ``seconds``:
    with no scrapes that is the NVML worker."""
    before = procs.thread_cpu(pid)
    time.sleep(seconds)
    after = procs.thread_cpu(pid)
    used = {t: cpu - before[t][1] for t, (_, cpu) in after.items() if t in before and t != pid}
    return max(used, key=lambda t: used[t])


def _cpu_ns(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


async def _rounds(port: int, scrapers: int, rounds: int, gap: float, stat: str) -> list[Any]:
    clients = [Scraper("127.0.0.1", port, "/metrics", True) for _ in range(scrapers)]
    out = []
    try:
        await asyncio.gather(*(c.get() for c in clients))  # opens the connections
        async for _ in paced(rounds, gap):
            before = _cpu_ns(stat)
            results = await asyncio.gather(*(c.get() for c in clients))
            met = _cpu_ns(stat) > before
            out.append((met, [lat for lat, _ in results]))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return out


def _summary(latencies: list[float], rounds: int) -> dict[str, Any]:
    if not latencies:
        return {"rounds": 0}
    ms = [x * 1e3 for x in latencies]
    return {
        "rounds": rounds,
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
    }


def measure(fleet: Path, interval_ms: int, rounds: int, scrapers: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gpu-exporter-collisions-"))
    with procs.ours(fleet, interval_ms, work / "exporter.log") as ours:
        ours.wait_http("/ready")
        tid = worker_tid(ours.pid)
        stat = f"/proc/{ours.pid}/task/{tid}/schedstat"
        got = asyncio.run(_rounds(ours.port, scrapers, rounds, GAP_S, stat))
    met = [lat for m, lats in got if m for lat in lats]
    other = [lat for m, lats in got if not m for lat in lats]
    return {
        "fleet": fleet.name,
        "interval_ms": interval_ms,
        "scrapers": scrapers,
        "met_cycle": _summary(met, sum(1 for m, _ in got if m)),
        "other": _summary(other, sum(1 for m, _ in got if not m)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.collisions", description=__doc__)
    p.add_argument("fleet", type=Path, help="fleet YAML file")
    p.add_argument("--interval-ms", type=int, default=200, help="the exporter's -c")
    p.add_argument("--rounds", type=int, default=1200)
    p.add_argument("--scrapers", type=int, default=10)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.fleet, a.interval_ms, a.rounds, a.scrapers), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
