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

import os
import sys
import time
from typing import Any

from benchmarks.accounting import cycles_main
from benchmarks.accounting import measure as measure_batches
from benchmarks.procs import rss_mib
from benchmarks.simnode import SimNode


def measure(fleet: str, cycles: int, warmup: int) -> dict[str, Any]:
    node = SimNode(fleet)
    for _ in range(warmup):
        node.timed_cycle()
    p0, t0 = time.process_time(), time.thread_time()
    result = measure_batches(node.timed_cycle, node.driver, cycles)
    # CPU of the process's other threads (the XID thread) over both passes; in *own*
    others_ms = ((time.process_time() - p0) - (time.thread_time() - t0)) * 1e3
    poller = node.poller
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
    node.close()
    return result


def main(argv: list[str] | None = None) -> int:
    return cycles_main(measure, "python -m benchmarks.cycle", __doc__, 50, 5, argv)


if __name__ == "__main__":
    sys.exit(main())
