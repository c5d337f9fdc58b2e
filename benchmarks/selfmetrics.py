"""Self-metrics render cost in process: the default simulated node's snapshot, µs per render.

python3 -m benchmarks.selfmetrics
"""

from __future__ import annotations

import sys
import time

from exporter import sim
from exporter.catalog import load
from exporter.collector import Collector
from exporter.config import default_metrics_file
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.sim.clock import ManualClock

BATCHES, PER_BATCH = 10, 100


def main() -> int:
    clock = ManualClock()
    sim.install(None, clock=clock)
    col = Collector(load(default_metrics_file()), "node-a", slow_s=5.0)
    try:
        sm = SelfMetrics(1.0)
        sm.snapshot = col.collect()
        sm.collections.update(success=100, failure=1)
        sm.nvml_errors = (("nvmlDeviceGetFanSpeed", "NOT_SUPPORTED", 8),)
        sm.render()
        best = float("inf")
        for _ in range(BATCHES):
            t0 = time.perf_counter()
            for _ in range(PER_BATCH):
                sm.render()
            best = min(best, (time.perf_counter() - t0) / PER_BATCH)
        lines = sm.render().count("\n")
    finally:
        col.close()
        sim.uninstall()
    print(
        f"self-metrics render: {best * 1e6:.0f} us ({lines} lines; "
        f"least of {BATCHES} x {PER_BATCH})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
