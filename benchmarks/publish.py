"""Publishing alone: the DCGM render and the build (self-metrics, plain and gzip bytes).

    python -m benchmarks.publish FLEET.yaml [--pods 60] [--batches 8]   (prints JSON)

Collects a dozen snapshots one simulated second apart, then publishes them in
turn, as consecutive cycles would be, in batches of 10; figures are ms of
thread CPU per publish from the quietest batch. With ``--pods N`` the first N
series devices (MIG instances first) are held by one container each, with the
same holders every cycle, as pod attribution hands them over while the
kubelet's answer does not change. No kubelet and no HTTP server: this is the
part of a cycle that ``Poller.publish`` runs in the worker thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import MappingProxyType
from typing import Any

from exporter import sim
from exporter.catalog import load
from exporter.collector import Collector
from exporter.config import default_metrics_file
from exporter.kube.attribution import Holder
from exporter.kube.mapper import Owner
from exporter.poller import Poller

EPOCH = 1.8e9
SNAPSHOTS = 12
BATCH = 10


def measure(fleet: str, n_pods: int, batches: int) -> dict[str, Any]:
    clock = sim.ManualClock()
    sim.install(fleet, clock=clock, latency=False)
    try:
        catalog = load(default_metrics_file())
        collector = Collector(catalog, "bench-node", clock=lambda: EPOCH + clock())
        poller = Poller(catalog, collector, interval_s=1.0, timeout_s=10.0)
        snaps = []
        for _ in range(SNAPSHOTS):
            clock.advance(1.0)
            snaps.append(collector.collect())
        last = snaps[-1]
        devices = sorted(last.entities, key=lambda d: not d.is_mig)  # MIG instances first
        holders = MappingProxyType(
            {
                d.key: Holder(Owner(f"team-{i % 7}", f"bench-{i:04d}-g0", "main"))
                for i, d in enumerate(devices[:n_pods])
            }
        )
        builder = poller.builder
        best = {"render_ms": float("inf"), "build_ms": float("inf")}
        for b in range(batches):
            render = build = 0.0
            for i in range(BATCH):
                snap = snaps[(b * BATCH + i) % SNAPSHOTS]
                c0 = time.thread_time()
                builder.dcgm(snap, catalog, holders or None)
                c1 = time.thread_time()
                poller.exposition = builder.build()
                c2 = time.thread_time()
                render, build = render + c1 - c0, build + c2 - c1
            best["render_ms"] = min(best["render_ms"], render / BATCH * 1e3)
            best["build_ms"] = min(best["build_ms"], build / BATCH * 1e3)
        collector.close()
        poller.close()
        return {
            "fleet": fleet,
            "pods": len(holders),
            **{k: round(v, 3) for k, v in best.items()},
            "publish_ms": round(best["render_ms"] + best["build_ms"], 3),
            "plain_bytes": len(poller.exposition.plain),
            "gzip_bytes": len(poller.exposition.gzipped),
        }
    finally:
        sim.uninstall()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.publish", description=__doc__)
    p.add_argument("fleet", help="fleet YAML file")
    p.add_argument("--pods", type=int, default=0, help="series devices held by a container")
    p.add_argument("--batches", type=int, default=8)
    a = p.parse_args(argv)
    if a.pods < 0 or a.batches < 1:
        p.error("--pods must be 0 or more and --batches 1 or more")
    json.dump(measure(a.fleet, a.pods, a.batches), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
