"""What pod attribution costs per collection cycle, by thread, and per kubelet ``List``.

    python -m benchmarks.kubecost FLEET.yaml [--pods 60] [--interval-ms 1000]
        [--window 60] [--runs 1] [--calls 2000]          (prints JSON)

Process part: gpu-exporter runs as a user starts it (benchmarks/procs.py), once
without ``-k`` and once with ``-k`` against benchmarks/kubelet.py listing
``--pods`` pods, in turn ``--runs`` times. After ready and ``--settle`` s, the CPU of
each thread is read from /proc/PID/task/* at the start and the end of a
``--window`` s window, and reported in ms per collection cycle (the window
divided by the interval), per thread group: ``main`` (the event loop),
``python`` (the other Python threads, the NVML worker first among them, by
CPU), ``native`` (threads started outside Python: grpcio's core threads when the
kubelet client was grpcio's; none with its own gRPC layer over h2), and the process
in all.
CPU is the scheduler's on-CPU time (/proc/.../schedstat, ns); where the kernel
does not keep it, utime + stime in clock ticks (10 ms), and then only a long
window makes the figures precise.

In-process part (``--calls``): ``Mapper.refresh`` on the fleet's devices
against the same stand-in kubelet (the kubelet's ``List`` and the pod map,
reused while the answer does not change: what each cycle does),
``--calls`` times back to back after a warm-up; CPU per call of the calling
thread and of the whole process (the mapper's worker thread included), and wall time
per call. Back to back, a client's background threads cost less per call than at
one call a second, which the process part shows. Then the CPU of decoding and
mapping a changed answer of ``--pods`` pods (``decode_map``: what a cycle adds when
pods come or go), in this thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import churn, pods, procs


def window(pid: int, seconds: float) -> dict[str, Any]:
    """CPU seconds per thread group and per busy thread over ``seconds``."""
    a, t0 = procs.thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    b, elapsed = procs.thread_cpu(pid), time.monotonic() - t0
    groups: dict[str, float] = defaultdict(float)
    threads = []
    for tid, (comm, cpu) in b.items():
        used = cpu - a.get(tid, (comm, 0.0))[1]
        groups[procs.thread_group(pid, tid, comm)] += used
        if used > 0:
            threads.append((used, f"{comm}[{tid}]"))
    gone = sum(cpu for tid, (_, cpu) in a.items() if tid not in b)
    return {
        "elapsed_s": elapsed,
        "groups": dict(groups),
        "threads": [(name, used) for used, name in sorted(threads, reverse=True)[:8]],
        "ended_threads_cpu_s": gone,
        "threads_seen": len(b),
    }


def measure_process(
    fleet: Path,
    interval_ms: int,
    seconds: float,
    sock: Path | None,
    work: Path,
    env: dict[str, str] | None = None,
    settle_s: float = 5.0,
) -> dict[str, Any]:
    """One exporter process (as procs.ours starts it, ``env`` added to its environment),
    with ``-k`` against ``sock`` when given; ms per cycle."""
    extra = ["-k", "--pod-resources-kubelet-socket", str(sock)] if sock else []
    flags = ["-c", str(interval_ms), "--log-level", "warning", *extra]
    env = {"NODE_NAME": "bench-node", **(env or {})}
    with procs.Exporter(*flags, fleet=fleet, env=env, log=work / "exporter.log") as p:
        p.wait_http("/ready")
        time.sleep(settle_s)
        w = window(p.pid, seconds)
        rss = p.rss()
        attributed = churn._attributed(p.get("/metrics")[2])
    cycles = w["elapsed_s"] * 1000 / interval_ms
    per = {g: 1000 * cpu / cycles for g, cpu in w["groups"].items()}
    return {
        "k": sock is not None,
        "ms_per_cycle": {**per, "process": sum(per.values())},
        "busiest_threads_ms_per_cycle": [(n, 1000 * c / cycles) for n, c in w["threads"]],
        "threads": w["threads_seen"],
        "rss_mib": rss,
        "attributed_series": attributed,
    }


def _devices(fleet: Path) -> tuple[list[Any], list[Any]]:
    """(GPUs, MIG instances) of one collection on the simulated fleet."""
    from benchmarks.simnode import SimNode

    with SimNode(fleet, manual=False) as node:
        snap = node.collector.collect()
    return list(snap.gpus), [d for d in snap.entities if d.is_mig]


async def _calls(sock: Path, fleet: Path, n: int, npods: int) -> dict[str, float]:
    """CPU per ``Mapper.refresh`` (the kubelet's List and the map, reused while the
    answer is unchanged), as the poller calls it once per cycle."""
    from exporter.workloads.kubelet.podresources import PodResourcesClient
    from exporter.workloads.mapper import Mapper

    gpus, instances = _devices(fleet)
    mapper = Mapper(PodResourcesClient(str(sock)))
    try:
        for _ in range(50):
            await mapper.refresh(gpus, instances)
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(n):
            await mapper.refresh(gpus, instances)
        wall, cpu, pcpu = (
            time.perf_counter() - t0,
            time.thread_time() - c0,
            time.process_time() - p0,
        )
    finally:
        mapper.close()
        await mapper.client.close()
    assert mapper.status == "" and mapper.rebuilds == 1, (mapper.status, mapper.rebuilds)
    return {
        "calls": n,
        "attributed_devices": len(mapper.map.owners),
        "thread_cpu_us_per_call": 1e6 * cpu / n,
        "process_cpu_us_per_call": 1e6 * pcpu / n,
        "wall_us_per_call": 1e6 * wall / n,
        "decode_map_us": _decode_map_us(fleet, gpus, instances, npods),
    }


def _decode_map_us(fleet: Path, gpus: list[Any], instances: list[Any], npods: int) -> float:
    """CPU (us, this thread, best of 5 rounds) to decode a List answer of ``npods`` pods
    (bounded, then protobuf) and build the map from it."""
    from benchmarks.kubelet import response
    from exporter.workloads import ids
    from exporter.workloads.kubelet.podresources import parse
    from exporter.workloads.mapper import Mapper

    raw = response(pods.assignments(pods.device_ids(fleet), npods)).SerializeToString()
    mapper, resolver = Mapper(client=None), ids.Resolver(gpus, instances)
    reps, best = max(1, 20_000 // max(npods, 1)), float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(reps):
            mapper.build(parse(raw)[0], resolver)
        best = min(best, (time.thread_time() - t0) / reps)
    return 1e6 * best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kubecost", description=__doc__)
    p.add_argument("fleet", type=Path)
    p.add_argument("--pods", type=int, default=60)
    p.add_argument("--interval-ms", type=int, default=1000)
    p.add_argument("--window", type=float, default=60.0, help="seconds of CPU accounting")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after ready, first")
    p.add_argument("--runs", type=int, default=1, help="without and with -k, in turn")
    p.add_argument("--calls", type=int, default=2000, help="in-process List calls (0: none)")
    p.add_argument("--no-plain", action="store_true", help="only the -k process")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the exporter's environment (not the stand-in kubelet's); repeatable",
    )
    a = p.parse_args(argv)
    out: dict[str, Any] = {"fleet": str(a.fleet), "pods": a.pods, "interval_ms": a.interval_ms}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        sock, listing = work / "kubelet.sock", work / "pods.json"
        pods.write(listing, pods.device_ids(a.fleet), a.pods)
        with churn.kubelet_process(sock, listing):
            if a.calls:
                out["refresh_call"] = asyncio.run(_calls(sock, a.fleet, a.calls, a.pods))
            env = dict(e.split("=", 1) for e in a.env)
            out["env"] = env
            runs = []
            for _ in range(a.runs):
                for s in (sock,) if a.no_plain else (None, sock):
                    runs.append(
                        measure_process(a.fleet, a.interval_ms, a.window, s, work, env, a.settle)
                    )
            out["processes"] = runs
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
