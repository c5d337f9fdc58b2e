"""One collection cycle of gpu-exporter, measured in a process of its own.

    python -m benchmarks.cycle FLEET.yaml --cycles 50   (prints one JSON object)

A cycle is what the poller does each interval: ``Collector.collect()`` in the
worker thread, then ``Poller.publish()`` (render, self-metrics, plain and gzip
bytes). Sim time is a ManualClock moved 1 s per cycle, so GPM always has a
previous sample and no real sleeping is needed. The simulated library is
instrumented (benchmarks/accounting.py), so each batch of cycles splits into
the exporter's own CPU, the simulator's bookkeeping and the modelled driver
cost. ``other_threads_ms`` is the CPU per cycle of the process's other threads (the
XID thread, waiting), which the exporter's own CPU includes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from benchmarks.accounting import measure as measure_batches
from benchmarks.procs import rss_mib
from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.poller import Poller

EPOCH = 1.8e9  # unix time the collector's clock starts at (any fixed value)


def measure(fleet: str, cycles: int, warmup: int) -> dict[str, Any]:
    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock)
    catalog = load(default_metrics_file())
    collector = Collector(catalog, "bench-node", clock=lambda: EPOCH + clock())
    poller = Poller(catalog, collector, interval_s=1.0, timeout_s=10.0)

    def one() -> tuple[float, float, float]:
        clock.advance(1.0)
        c0, w0 = time.process_time(), time.perf_counter()
        snap = collector.collect()
        c1, w1 = time.process_time(), time.perf_counter()
        poller.publish(snap)
        c2 = time.process_time()
        return c1 - c0, w1 - w0, c2 - c1

    for _ in range(warmup):
        one()
    p0, t0 = time.process_time(), time.thread_time()
    result = measure_batches(one, driver, cycles)
    # CPU of the process's other threads (the XID thread) over both passes; in *own*
    others_ms = ((time.process_time() - p0) - (time.thread_time() - t0)) * 1e3
    expo = poller.exposition
    snap = poller.snapshot
    assert snap is not None and snap.ok, snap and snap.problems
    result.update(
        {
            "gpus": len(snap.gpus),
            "mig": sum(1 for d in snap.entities if d.is_mig),
            "cycles": cycles,
            "other_threads_ms": others_ms / (2 * cycles + 1),
            "series": poller.selfmetrics.series,
            "lines": expo.plain.count(b"\n"),
            "plain_bytes": len(expo.plain),
            "gzip_bytes": len(expo.gzipped),
            "rss_mib": rss_mib(os.getpid()),
        }
    )
    collector.close()
    poller.close()
    sim.uninstall()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cycle", description=__doc__)
    p.add_argument("fleet", help="fleet YAML file")
    p.add_argument("--cycles", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    json.dump(measure(args.fleet, args.cycles, args.warmup), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
