"""RSS over many collection cycles with MIG churn, in the exporter's own code path.

    python -m benchmarks.churn FLEET.yaml --cycles 10000 --every 10   (prints JSON)

Builds the real application (``exporter.app.build``: aiohttp app, poller,
collector) and serves it on 127.0.0.1, then drives ``Poller.cycle()`` back to
back instead of once per interval, moving a ManualClock 1 s per cycle so GPM
and the values advance as they would. Every ``--every`` cycles one GPU (round
robin) gets a ``mig_reconfigure`` fault, alternating between seven 1g.10gb
instances and 3g.40gb + 2g.20gb + 2x 1g.10gb, so MIG devices keep vanishing
and appearing with new UUIDs. VmRSS is sampled after warm-up and every
``--sample`` cycles; one scrape goes through the HTTP server at each sample.

With ``--pods N``, the exporter runs with ``-k`` against benchmarks/kubelet.py
serving N pods (benchmarks/pods.py); the pod list follows each new MIG layout,
and every ``--pod-every`` cycles a tenth of the pods is replaced by new ones.

With ``--trace``, tracemalloc compares the heap after warm-up with the heap
at the end, grouped by file, to say where growth comes from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks import pods
from benchmarks.fleets import LAYOUT_MIXED, LAYOUT_SEVEN
from benchmarks.load import fetch
from benchmarks.procs import Process, free_port, rss_mib
from exporter import sim
from exporter.app import POLLER, build
from exporter.catalog.metricsfile import load
from exporter.cli import build_parser
from exporter.config.resolve import config_from

EPOCH = 1.8e9


async def run(
    fleet: str,
    cycles: int,
    every: int,
    sample: int,
    warmup: int,
    trace: bool,
    latency: bool,
    n_pods: int = 0,
    pod_every: int = 10,
) -> dict[str, Any]:
    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock, latency=latency)
    port = free_port()
    argv = ["-a", f"127.0.0.1:{port}", "-c", "60000"]
    kubelet = None
    if n_pods:
        work = Path(tempfile.mkdtemp(prefix="gpu-exporter-churn-"))
        sock, pods_file = work / "kubelet.sock", work / "pods.json"
        pods.write(pods_file, pods.device_ids_of(driver), n_pods)
        kubelet = kubelet_process(sock, pods_file)
        argv += ["-k", "--pod-resources-kubelet-socket", str(sock)]
    cfg = config_from(build_parser().parse_args(argv), {"NODE_NAME": "bench-node"})
    catalog = load(cfg.metrics_file)
    app = build(cfg, catalog)
    poller = app[POLLER]
    # Sim time, not wall time: back-to-back cycles must still be 1 s apart for GPM.
    poller.collector.clock = lambda: EPOCH + clock()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    replaced = 0
    try:
        while poller.snapshot is None:  # the first cycle has been published
            await asyncio.sleep(0.01)
        mig_gpus = [g.index for g in driver.gpus if g.mig_enabled]
        state = dict.fromkeys(mig_gpus, False)  # False: seven instances now
        reconfigs = 0
        samples: list[tuple[int, float]] = []
        top: list[tuple[str, float]] = []
        cpu0, t0 = time.process_time(), time.monotonic()
        for i in range(1, warmup + cycles + 1):
            clock.advance(1.0)
            await poller.cycle()
            if mig_gpus and i % every == 0:
                gpu = mig_gpus[(i // every) % len(mig_gpus)]
                state[gpu] = not state[gpu]
                layout = LAYOUT_MIXED if state[gpu] else LAYOUT_SEVEN
                driver.inject(sim.Fault("mig_reconfigure", gpu=gpu, mig=layout))
                reconfigs += 1
                if n_pods:  # the device plugin hands out the new instances
                    pods.write(pods_file, pods.device_ids_of(driver), n_pods, replaced)
            if n_pods and i % pod_every == 0:
                replaced += max(1, n_pods // 10)  # a tenth of the pods replaced
                pods.write(pods_file, pods.device_ids_of(driver), n_pods, replaced)
            if i == warmup:
                if trace:
                    tracemalloc.start()
                    base = tracemalloc.take_snapshot()
                samples.append((0, rss_mib(os.getpid())))
            elif i > warmup and (i - warmup) % sample == 0:
                status, _ = await fetch(port, gzip=True)
                assert status == 200, status
                samples.append((i - warmup, rss_mib(os.getpid())))
        if trace:
            end = tracemalloc.take_snapshot()
            diff = end.compare_to(base, "filename")
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            top = [(s.traceback[0].filename.replace(root + "/", ""), s.size_diff) for s in diff[:8]]
            tracemalloc.stop()
        snap = poller.snapshot
        live = {d.key for d in snap.entities if d.is_mig} if snap else set()
        return {
            "cycles": cycles,
            "warmup": warmup,
            "reconfigs": reconfigs,
            "samples": samples,
            "cpu_ms_per_cycle": (time.process_time() - cpu0) / (warmup + cycles) * 1e3,
            "wall_s": time.monotonic() - t0,
            "last_ok": bool(snap and snap.ok),
            "mig_now": sum(1 for d in snap.entities if d.is_mig) if snap else 0,
            "skipped": poller.selfmetrics.collections["skipped"],
            "trace_top": top,
            # Objects still held at the end, for the report's attribution of growth:
            "live_mig": len(live),
            "exporter_mig_devices_held": len(getattr(poller.collector.enumerator, "_mig", {})),
            "sim_handles_held": len(driver.handles),
            "pods": n_pods,
            "pods_replaced": replaced,
            "attributed": _attributed(poller.exposition.plain),
        }
    finally:
        await runner.cleanup()
        sim.uninstall()
        if kubelet is not None:
            kubelet.stop()


def kubelet_process(sock: Path, pods_file: Path) -> Process:
    """benchmarks.kubelet serving `pods_file` on `sock`, once the socket is there."""
    k = Process([sys.executable, "-m", "benchmarks.kubelet", str(sock), str(pods_file)], 0)
    for _ in range(200):
        if sock.exists():
            return k
        if k.proc.poll() is not None:
            break
        time.sleep(0.05)
    k.stop()
    raise RuntimeError(f"the stand-in kubelet did not open {sock}")


def _attributed(plain: bytes) -> int:
    """Series that carry a pod label."""
    return sum(1 for line in plain.splitlines() if b'pod="bench-' in line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.churn", description=__doc__)
    p.add_argument("fleet")
    p.add_argument("--cycles", type=int, default=10000)
    p.add_argument("--every", type=int, default=10, help="cycles between MIG reconfigurations")
    p.add_argument("--sample", type=int, default=1000, help="cycles between RSS samples")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--trace", action="store_true", help="attribute heap growth with tracemalloc")
    p.add_argument(
        "--no-latency",
        action="store_true",
        help="latency model off (it burns CPU, allocates nothing)",
    )
    p.add_argument("--pods", type=int, default=0, help="pods on the stand-in kubelet (0: no -k)")
    p.add_argument(
        "--pod-every", type=int, default=10, help="cycles between replacing a tenth of the pods"
    )
    a = p.parse_args(argv)
    result = asyncio.run(
        run(
            a.fleet,
            a.cycles,
            a.every,
            a.sample,
            a.warmup,
            a.trace,
            not a.no_latency,
            a.pods,
            a.pod_every,
        )
    )
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
