"""What GPU accounting costs: CPU per cycle, process lists, and memory under holder churn.

    python -m benchmarks.ledger FLEET.yaml [--pods 60] [--batches 8]
        [--churn 2000] [--retention 120]                        (prints JSON)

``publish``: the worker's publish step (the holders' uses as pod attribution hands them
over, the derive stage, the render, self-metrics, plain and gzip bytes) on snapshots one
simulated second apart, ``--pods`` of the series devices held by one container each
(MIG instances first, as benchmarks/pods.py hands them out): ``with_ms``. Accounting
alone (a Ledger's update and frozen values, then their text, as the derive stage and
the render run them) on the same snapshots, batch for batch in turn with the publish
step (paired rounds: the host's speed moves within seconds): ``extra_ms`` is its median
per cycle, ``without_ms`` the publish step less it. With ``--replace N`` one pod is
replaced by a new one every N cycles, so that ended holders accumulate for the
retention (all of them, in a run this short).

``processes``: the modelled driver cost of the process lists a cycle reads (latency
model on), with the accounting policy (workloads/usage.py: shared devices, devices no one
holds that have memory in use), with it when host PIDs can be joined to pods (also
``HELD_PER_CYCLE`` held devices a cycle, in turn) and, for comparison, on every device.

``churn``: ``--churn`` holders come and go, one new pod replacing one old each
simulated second (a cycle); RSS after warm-up, at most, and at the end, once every
ended holder is past ``--retention`` and dropped, and the holders kept then.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from benchmarks.procs import rss_mib
from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.derive.accounting.ledger import Ledger
from exporter.exposition.accounting import AccountText
from exporter.frame import Owner
from exporter.poller import Poller
from exporter.workloads.mapper import PodMap
from exporter.workloads.usage import Usage, device_uses, wants_processes

EPOCH = 1.8e9
BATCH = 10


def _podmap(keys: list[str], replaced: int = 0) -> PodMap:
    """Pod i holds device i; ``replaced`` pods so far were replaced by new ones, round robin."""
    n = len(keys) or 1
    owners = {
        k: (Owner(f"team-{i % 7}", f"bench-{i:04d}-g{replaced // n + (i < replaced % n)}", "main"),)
        for i, k in enumerate(keys)
    }
    return PodMap(MappingProxyType(owners))


def publish(fleet: str, pods: int, batches: int, replace: int = 0) -> dict[str, Any]:
    clock = sim.ManualClock()
    sim.install(fleet, clock=clock, latency=False)
    try:
        catalog = load(default_metrics_file())
        collector = Collector(catalog, "bench-node", clock=lambda: EPOCH + clock())
        snaps = []
        for _ in range((batches + 1) * BATCH):
            clock.advance(1.0)
            snaps.append(collector.collect())
        devices = sorted(snaps[-1].entities, key=lambda d: not d.is_mig)[:pods]
        keys = [d.key for d in devices]
        # with --replace N, one pod is replaced by a new one every N cycles
        podmaps = [_podmap(keys, i // replace if replace else 0) for i in range(len(snaps))]
        usage = Usage()
        uses = [
            usage.uses(snap, pm, None) if pods else None  # --pods 0: each device holds itself
            for snap, pm in zip(snaps, podmaps, strict=True)
        ]
        poller = Poller(catalog, collector, 1.0, 10.0)
        ledger, account_text = Ledger(), AccountText()
        results: dict[str, list[float]] = {"publish": [], "accounting": []}
        acct = b""

        def publish(i: int) -> None:
            frame = poller.derive.cycle(snaps[i], catalog, uses=uses[i])
            poller.builder.render(frame, catalog)
            poller.exposition = poller.builder.build()

        def accounting(i: int) -> None:
            nonlocal acct
            ledger.update(snaps[i], uses[i])
            acct = account_text.families(ledger.accounts(uses[i], snaps[i].entities))[0].encode()

        for b in range(batches + 1):  # the first round warms up
            for part in ("publish", "accounting") if b % 2 else ("accounting", "publish"):
                step = publish if part == "publish" else accounting
                c0 = time.thread_time()
                for i in range(b * BATCH, (b + 1) * BATCH):
                    step(i)
                if b:
                    results[part].append((time.thread_time() - c0) / BATCH * 1e3)
        extra = statistics.median(results["accounting"])
        expo = poller.exposition
        out = {
            "pods": len(devices),
            "with_ms": round(min(results["publish"]), 3),
            "without_ms": round(min(results["publish"]) - extra, 3),
            "extra_ms": round(extra, 3),
            "replace_every": replace,
            "holders": len(poller.derive.ledger.holders),
            "plain_bytes": len(expo.plain),
            "plain_bytes_without": len(expo.plain) - len(acct),
            "gzip_bytes": len(expo.gzipped),
        }
        poller.close()
        collector.close()
        return out
    finally:
        sim.uninstall()


def processes(fleet: str, pods: int) -> dict[str, Any]:
    """Modelled driver ms per cycle of the process lists, by policy."""
    from benchmarks.accounting import measure as measure_batches

    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock)
    try:
        catalog = load(default_metrics_file())
        out: dict[str, Any] = {}
        keys = [m.uuid for g in driver.gpus for m in g.migs] + [
            g.uuid for g in driver.gpus if not g.mig_enabled
        ]
        podmap = _podmap(keys[:pods])
        turns = itertools.count()
        policies: dict[str, Callable[[], Any]] = {
            "accounting": lambda: wants_processes(podmap, join=False),
            "accounting_joined": lambda: wants_processes(podmap, True, next(turns)),
            "every_device": lambda: lambda key, values: True,
        }
        for name, policy in policies.items():
            collector = Collector(
                catalog, "bench-node", clock=lambda: EPOCH + clock(), wants_processes=policy
            )

            def one(c: Collector = collector) -> tuple[float, float, float]:
                clock.advance(1.0)
                c0, w0 = time.process_time(), time.perf_counter()
                c.collect()
                return time.process_time() - c0, time.perf_counter() - w0, 0.0

            for _ in range(3):
                one()
            r = measure_batches(one, driver, 20)
            out[name] = {
                "modelled_driver_ms": round(r["modelled_driver_ms"], 3),
                "process_list_ms": round(
                    sum(
                        v
                        for k, v in r["modelled_by_function_ms"].items()
                        if "RunningProcesses" in k
                    ),
                    3,
                ),
            }
            collector.close()
        return out
    finally:
        sim.uninstall()


def churn(fleet: str, holders: int, retention_s: float) -> dict[str, Any]:
    """RSS while ``holders`` pods come and go, one replaced per simulated second."""
    clock = sim.ManualClock()
    sim.install(fleet, clock=clock, latency=False)
    try:
        catalog = load(default_metrics_file())
        collector = Collector(catalog, "bench-node", clock=lambda: EPOCH + clock())
        poller = Poller(catalog, collector, 1.0, 10.0)
        poller.derive.ledger.retention_s = retention_s
        keys = sorted(d.key for d in collector.collect().entities)
        pods = [f"pod-{i:06d}" for i in range(len(keys))]

        def cycle(replaced: int) -> None:
            clock.advance(1.0)
            snap = collector.collect()
            if replaced:  # one new pod in the place of one old, round robin
                pods[replaced % len(pods)] = f"pod-{len(keys) + replaced:06d}"
            owners = {k: (Owner("churn", pod, "main"),) for k, pod in zip(keys, pods, strict=True)}
            uses = device_uses(snap, PodMap(MappingProxyType(owners)), None)
            poller.builder.render(poller.derive.cycle(snap, catalog, uses=uses), catalog)
            poller.exposition = poller.builder.build()

        for _ in range(20):
            cycle(0)
        warm = rss_mib(os.getpid())
        peak = warm
        c0 = time.process_time()
        for r in range(1, holders + 1):
            cycle(r)
            if r % 50 == 0:
                peak = max(peak, rss_mib(os.getpid()))
        cpu_ms = (time.process_time() - c0) / holders * 1e3
        most_kept = len(poller.derive.ledger.holders)
        for _ in range(int(retention_s) + 5):
            cycle(0)
        ledger = poller.derive.ledger
        out = {
            "holders_gone": holders,
            "retention_s": retention_s,
            "rss_warm_mib": round(warm, 2),
            "rss_peak_mib": round(max(peak, rss_mib(os.getpid())), 2),
            "rss_end_mib": round(rss_mib(os.getpid()), 2),
            "cpu_ms_per_cycle": round(cpu_ms, 3),
            "holders_kept_at_most": most_kept,
            "holders_kept_end": len(ledger.holders),
            "dropped": dict(ledger.dropped),
        }
        collector.close()
        return out
    finally:
        sim.uninstall()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ledger", description=__doc__)
    p.add_argument("fleet")
    p.add_argument("--pods", type=int, default=60)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--churn", type=int, default=2000, help="holders that come and go (0: skip)")
    p.add_argument("--retention", type=float, default=120.0)
    p.add_argument("--replace", type=int, default=0, help="publish: a pod replaced every N cycles")
    p.add_argument("--parts", default="publish,processes,churn")
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    out: dict[str, Any] = {"fleet": a.fleet}
    if "publish" in parts:
        out["publish"] = publish(a.fleet, a.pods, a.batches, a.replace)
    if "processes" in parts:
        out["processes"] = processes(a.fleet, a.pods)
    if "churn" in parts and a.churn:
        out["churn"] = churn(a.fleet, a.churn, a.retention)
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
