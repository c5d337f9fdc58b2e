"""Self-metrics render cost in process: prometheus-client's ProcessCollector and
generate_latest over a private registry, on a simulated node's snapshot, µs per render.

    python3 -m benchmarks.selfmetrics [FLEET.yaml] [--pods N]

With ``--pods N`` the self-metrics also carry what pod attribution reports (kubelet and
API server up, N devices held, unmatched IDs and dropped inputs under two names each,
the podresources collector); the families do not grow with N, only their values change.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.frame import KubeStatus
from exporter.sim.clock import ManualClock
from exporter.snapshot import CollectorResult

BATCHES, PER_BATCH = 10, 100


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.selfmetrics")
    ap.add_argument("fleet", nargs="?", type=Path, help="fleet file (default: the default node)")
    ap.add_argument("--pods", type=int, default=0, help="devices held by pods (-k)")
    args = ap.parse_args(argv)
    clock = ManualClock()
    sim.install(args.fleet, clock=clock)
    col = Collector(load(default_metrics_file()), "node-a", slow_s=5.0)
    try:
        kube = None
        if args.pods:
            status = KubeStatus(
                True, True, (("nvidia.com/gpu", 3), ("nvidia.com/mig-1g.10gb", 1)), args.pods,
                (("kubelet.device_ids", 2), ("apiserver.pods", 1)), 0,
            )  # fmt: skip
            kube = lambda: status  # noqa: E731
        sm = SelfMetrics(1.0, kube)
        sm.snapshot = col.collect()
        if args.pods:
            sm.extra_results = (CollectorResult("podresources", True, 0.002),)
        sm.collections.update(success=100, failure=1)
        sm.nvml_errors = (("nvmlDeviceGetFanSpeed", "NOT_SUPPORTED", 8),)
        sm.render()
        best = float("inf")
        for _ in range(BATCHES):
            t0 = time.perf_counter()
            for _ in range(PER_BATCH):
                sm.render()
            best = min(best, (time.perf_counter() - t0) / PER_BATCH)
        lines = sm.render().count(b"\n")
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
