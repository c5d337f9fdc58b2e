"""Publishing alone: derive and render, and the build (self-metrics, plain and gzip bytes).

    python -m benchmarks.publish FLEET.yaml [--pods 60] [--batches 8]   (prints JSON)

Collects a dozen snapshots one simulated second apart, then publishes them in
turn, as consecutive cycles would be, in batches of 10; figures are ms of
thread CPU per publish from the quietest batch. With ``--pods N`` the first N
series devices (MIG instances first) are held by one container each, with the
same holders every cycle, as pod attribution hands them over while the
kubelet's answer does not change. No kubelet and no HTTP server: this is the
part of a cycle that ``Poller.publish`` runs in the worker thread.

With pods, a second publisher without them takes turns with the first, batch for
batch, on the same snapshots: ``without`` holds its figures and ``pods_extra_ms``
the median of the per-round differences (with less without). The host's speed
moves within seconds, so two publishers measured one after the other differ by
more than the pod labels cost; paired rounds see the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from exporter import sim
from exporter.catalog.metricsfile import Catalog, load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.frame import Held, Holder, Owner
from exporter.poller import Poller
from exporter.snapshot import Snapshot

EPOCH = 1.8e9
SNAPSHOTS = 12
BATCH = 10


class _Publisher:
    """One poller's builder publishing the snapshots in turn, with fixed holders."""

    def __init__(self, catalog: Catalog, collector: Collector, holders: Mapping[str, Holder]):
        self.catalog = catalog
        self.holders = holders or None
        self.poller = Poller(catalog, collector, interval_s=1.0, timeout_s=10.0)
        self.best = {"render_ms": float("inf"), "build_ms": float("inf")}
        self.batches: list[float] = []  # ms per publish, per batch

    def batch(self, snaps: list[Snapshot], first: int) -> None:
        builder = self.poller.builder
        held = Held(self.holders)
        render = build = 0.0
        for i in range(BATCH):
            snap = snaps[(first + i) % SNAPSHOTS]
            c0 = time.thread_time()
            builder.render(self.poller.derive.cycle(snap, self.catalog, held), self.catalog)
            c1 = time.thread_time()
            self.poller.exposition = builder.build()
            c2 = time.thread_time()
            render, build = render + c1 - c0, build + c2 - c1
        self.best["render_ms"] = min(self.best["render_ms"], render / BATCH * 1e3)
        self.best["build_ms"] = min(self.best["build_ms"], build / BATCH * 1e3)
        self.batches.append((render + build) / BATCH * 1e3)

    def result(self) -> dict[str, Any]:
        expo = self.poller.exposition
        return {
            **{k: round(v, 3) for k, v in self.best.items()},
            "publish_ms": round(self.best["render_ms"] + self.best["build_ms"], 3),
            "plain_bytes": len(expo.plain),
            "gzip_bytes": len(expo.gzipped),
        }


def measure(fleet: str, n_pods: int, batches: int) -> dict[str, Any]:
    clock = sim.ManualClock()
    sim.install(fleet, clock=clock, latency=False)
    try:
        catalog = load(default_metrics_file())
        collector = Collector(catalog, "bench-node", clock=lambda: EPOCH + clock())
        snaps = []
        for _ in range(SNAPSHOTS):
            clock.advance(1.0)
            snaps.append(collector.collect())
        devices = sorted(snaps[-1].entities, key=lambda d: not d.is_mig)  # MIG instances first
        holders = MappingProxyType(
            {
                d.key: Holder(Owner(f"team-{i % 7}", f"bench-{i:04d}-g0", "main"))
                for i, d in enumerate(devices[:n_pods])
            }
        )
        mine = _Publisher(catalog, collector, holders)
        bare = _Publisher(catalog, collector, {}) if holders else None
        for b in range(batches):
            for p in (mine, bare) if b % 2 else (bare, mine):  # each goes first half the time
                if p is not None:
                    p.batch(snaps, b * BATCH)
        out = {"fleet": fleet, "pods": len(holders), **mine.result()}
        if bare is not None:
            out["without"] = bare.result()
            diffs = [a - b for a, b in zip(mine.batches, bare.batches, strict=True)]
            out["pods_extra_ms"] = round(statistics.median(diffs), 3)
        collector.close()
        for p in (mine, bare):
            if p is not None:
                p.poller.close()
        return out
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
