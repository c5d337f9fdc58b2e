"""The whole benchmark: every measurement, in order, into one results mapping.

Each measurement runs in a process of its own (``benchmarks.cycle``,
``benchmarks.churn``, the exporter, the peer, the floor server) so that
module state, RSS and CPU never mix; this process only starts them, runs the
scrape client and reads /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import churn, fleets, machine, peer, pods, procs
from benchmarks.fleets import FleetCase
from benchmarks.procs import ROOT
from benchmarks.scrapes import floor_server, paired
from benchmarks.scrapes import scrapes as scrape_rows


@dataclass(frozen=True)
class Sizes:
    """How much of everything a run does; QUICK keeps the test suite's run to seconds."""

    cycles: int = 40  # in-process cycles per fleet (each pass)
    warmup: int = 5
    settle_s: float = 3.0  # after /ready, before measuring a process
    cpu_window_s: float = 10.0  # CPU rate at a 1 s interval, target node
    scale_cpu_window_s: float = 5.0  # the same, other nodes
    cpu10_window_s: float = 30.0  # CPU rate at a 10 s interval (3 cycles); 0: skip
    cpu30_window_s: float = 90.0  # the same at 30 s, dcgm-exporter's default (3 cycles)
    scrapers: tuple[int, ...] = (1, 10, 50)
    requests: int = 1500  # per scrape configuration on the target node
    repeats: int = 3  # target node: each configuration this many times
    spread_s: float = 2.0  # each run's rounds spread over this long (1 s collection cycles)
    scale_requests: int = 600  # per configuration on the other nodes
    churn_cycles: int = 10_000
    churn_every: int = 10
    churn_sample: int = 1000
    churn_warmup: int = 100
    pod_counts: tuple[int, ...] = (60, 1000)  # besides 0; the churn runs with the first
    trace_cycles: int = 300
    peer_cycles: int = 8
    peer_scrapers: tuple[int, ...] = (1, 10)
    peer_requests: int = 40


QUICK = Sizes(
    cycles=3,
    warmup=1,
    settle_s=0.3,
    cpu_window_s=0.5,
    scale_cpu_window_s=0.5,
    cpu10_window_s=0.5,
    cpu30_window_s=0.5,
    scrapers=(1, 10),
    requests=40,
    repeats=1,
    spread_s=0.2,
    scale_requests=20,
    churn_cycles=20,
    churn_every=5,
    churn_sample=10,
    churn_warmup=3,
    pod_counts=(3,),
    trace_cycles=0,
    peer_cycles=1,
    peer_scrapers=(1,),
    peer_requests=5,
)


def _children(*jobs: tuple[str, list[str]]) -> list[dict[str, Any]]:
    """``python -m module args`` for each (module, args) at once: the JSON each printed
    last, in order."""
    running = [
        subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for module, args in jobs
    ]
    out = []
    for (module, args), p in zip(jobs, running, strict=True):
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{module} {' '.join(args)} failed:\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _child(module: str, *args: str) -> dict[str, Any]:
    """``python -m module args`` in a process of its own: the JSON it printed last."""
    return _children((module, list(args)))[0]


def measure_pods(
    case: FleetCase,
    path: Path,
    n: int,
    work: Path,
    s: Sizes,
    log: Callable[[str], None],
    scrape: bool = True,
) -> dict[str, Any]:
    """gpu-exporter with -k against the stand-in kubelet listing n pods (scrapes optional)."""
    name = f"{case.name}-{n}"
    sock, listing = work / f"kubelet-{name}.sock", work / f"pods-{name}.json"
    pods.write(listing, pods.device_ids(path), n)
    log(f"  {case.name}: {n} pods")
    scrapes: list[dict[str, Any]] = []
    with churn.kubelet_process(sock, listing) as _kubelet:
        flags = ["-k", "--pod-resources-kubelet-socket", str(sock)]
        with procs.ours(path, 1000, work / f"exporter-pods-{name}.log", flags) as p:
            p.wait_http("/ready")
            time.sleep(s.settle_s)
            rss = p.rss()
            rates = procs.cpu_rates(p, s.cpu_window_s if scrape else s.scale_cpu_window_s)
            idle = rates["process"]
            plain, gzipped = p.bodies()
            if scrape:
                configs = [(10, True), (10, False)]
                scrapes = scrape_rows(p.port, configs, s.scale_requests, s.spread_s, 1, p, idle)
    m = re.search(rb"^gpu_exporter_series (\S+)$", plain, re.M)
    return {
        "pods": n,
        "rss_mib": rss,
        "cpu_1s": idle,
        "cpu_groups_1s": rates,
        "series": int(float(m.group(1))) if m else None,
        "attributed": churn._attributed(plain),
        "plain_bytes": len(plain),
        "gzip_bytes": len(gzipped),
        "scrapes": scrapes,
    }


def measure_process(
    case: FleetCase, path: Path, work: Path, s: Sizes, target: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    """gpu-exporter as a process: RSS, CPU at a 1 s interval, scrape latency and cost."""
    with procs.ours(path, 1000, work / f"exporter-{case.name}.log") as p:
        p.wait_http("/ready")
        time.sleep(s.settle_s)
        rss = p.rss()
        rates = procs.cpu_rates(p, s.cpu_window_s if target else s.scale_cpu_window_s)
        idle = rates["process"]
        if target:
            configs = [(n, gz) for n in s.scrapers for gz in (True, False)]
            load = (s.requests, s.spread_s, s.repeats)
        else:
            configs = [(10, True), (10, False)]
            load = (s.scale_requests, s.spread_s, 1)
        log(f"  {case.name}: scrapes {configs}")
        if target:
            # The floor server shares each run with the exporter: same bytes, client, machine load.
            plain, gzipped = p.bodies()
            with floor_server(work, plain, gzipped) as floor_port:
                rows, floor = paired(p.port, floor_port, configs, load, p, idle)
        else:
            rows, floor = scrape_rows(p.port, configs, *load, proc=p, idle_rate=idle), None
        rss_after = p.rss()
    result = {
        "rss_mib": rss,
        "rss_after_scrapes_mib": rss_after,
        "cpu_1s": idle,
        "cpu_groups_1s": rates,
        "scrapes": rows,
    }
    if floor is not None:
        result["floor"] = floor
    return result


def measure_interval(
    path: Path, work: Path, interval_s: int, window_s: float, pods_n: int = 0
) -> float | None:
    """CPU seconds per second at a ``interval_s`` collection interval, no scrapes, with
    ``pods_n`` pods (the stand-in kubelet) when not 0; None when ``window_s`` is 0."""
    if not window_s:
        return None
    name = f"{interval_s}s-{pods_n}"
    with contextlib.ExitStack() as stack:
        flags: list[str] = []
        if pods_n:
            sock, listing = work / f"kubelet-{name}.sock", work / f"pods-{name}.json"
            pods.write(listing, pods.device_ids(path), pods_n)
            stack.enter_context(churn.kubelet_process(sock, listing))
            flags = ["-k", "--pod-resources-kubelet-socket", str(sock)]
        log = work / f"exporter-{name}.log"
        p = stack.enter_context(procs.ours(path, interval_s * 1000, log, flags))
        p.wait_http("/ready")
        time.sleep(1.0)
        return procs.cpu_rate(p, window_s)


def measure_peer(
    case: FleetCase, path: Path, work: Path, s: Sizes, log: Callable[[str], None]
) -> dict[str, Any]:
    """nvitop-exporter: CPU per cycle in-process, then its process on the same node."""
    version = peer.ensure(work / "peer-venv.log")
    log(f"  nvitop-exporter {version}: collection cycle")
    cyc = peer.cycle(path, s.peer_cycles, 2 if s.peer_cycles > 2 else 1)
    log("  nvitop-exporter: process (interval 1 s)")
    with peer.start(path, 1.0, work / "peer.log") as p:
        p.wait_http("/metrics", timeout=120)
        # Its first cycle starts after the server: wait until one is done.
        time.sleep(max(s.settle_s, cyc["collect_wall_ms"] / 1e3 * 1.5))
        rss = p.rss()
        idle = procs.cpu_rate(p, s.cpu_window_s)
        configs = [(n, gz) for n in s.peer_scrapers for gz in (True, False)]
        scrapes = scrape_rows(p.port, configs, s.peer_requests, s.spread_s, 1, p, idle)
        rss_after = p.rss()
    # At 1 s it collects back to back, so /proc cannot tell its scrapes' CPU from its
    # cycles': scrape it again while its collector idles (one cycle per minute).
    log("  nvitop-exporter: process (interval 60 s, scrape cost alone)")
    with peer.start(path, 60.0, work / "peer-60s.log") as p:
        p.wait_http("/metrics", timeout=120)
        time.sleep(max(s.settle_s, cyc["collect_wall_ms"] / 1e3 * 1.5))
        idle60 = procs.cpu_rate(p, s.settle_s)
        gzip_only = [(n, gz) for n, gz in configs if gz]  # what Prometheus asks for
        scrapes60 = scrape_rows(p.port, gzip_only, s.peer_requests, s.spread_s, 1, p, idle60)
    return {
        "version": version,
        "cycle": cyc,
        "rss_mib": rss,
        "rss_after_scrapes_mib": rss_after,
        "cpu_1s": idle,
        "scrapes": scrapes,
        "scrapes_idle": scrapes60,
    }


def run(
    quick: bool, with_peer: bool, work: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every measurement; returns the results mapping the report is written from."""
    s = QUICK if quick else Sizes()
    t_start = time.monotonic()
    res: dict[str, Any] = {"quick": quick, "machine": machine.facts(), "sizes": s.__dict__}
    cases = fleets.scaling(quick)
    target = fleets.target(quick)
    paths = {c.name: c.write(work) for c in cases}

    def cycle(c: FleetCase) -> dict[str, Any]:
        args = ("--cycles", str(s.cycles), "--warmup", str(s.warmup))
        return _child("benchmarks.cycle", str(paths[c.name]), *args)

    log("collection cycle, in-process, per fleet")
    res["cycle"] = {}
    for c in cases:
        log(f"  {c.name}")
        res["cycle"][c.name] = cycle(c)
    # The target node's cycle again in the middle and at the end of the run: a burst of
    # other work on the machine lasts seconds and only ever adds CPU, so the target row
    # takes the run with the least net CPU and reports all of them.
    target_cycles = [res["cycle"][target.name]]

    # The pods' share of the worker thread: the publish with pod labels, against without,
    # in turns within one process (see benchmarks/publish.py).
    n = s.pod_counts[0]
    log(f"publish in-process, {target.name}, with and without {n} pods, in turns")
    pub = _child("benchmarks.publish", str(paths[target.name]), "--pods", str(n), "--batches", "16")
    res["publish"] = {"0": pub.get("without", pub), str(n): pub}

    log("exporter processes, per fleet")
    res["process"] = {}
    for c in cases if not quick else [target]:
        res["process"][c.name] = measure_process(
            c, paths[c.name], work, s, c.name == target.name, log
        )
    log(f"exporter processes with -k and {', '.join(map(str, s.pod_counts))} pods")
    res["pods"] = {
        str(n): measure_pods(target, paths[target.name], n, work, s, log) for n in s.pod_counts
    }
    log(f"scale curve: exporter processes with -k and {n} pods, per fleet")
    res["scale_pods"] = {
        c.name: measure_pods(c, paths[c.name], n, work, s, log, scrape=False) for c in cases
    }
    log(f"collection cycle, in-process, {target.name}, again")
    target_cycles.append(cycle(target))
    log(f"exporter process at 10 s and 30 s intervals, without pods and with {n}")
    res["cpu_10s"] = measure_interval(paths[target.name], work, 10, s.cpu10_window_s)
    res["intervals"] = {
        str(sec): measure_interval(paths[target.name], work, sec, window, n)
        for sec, window in ((10, s.cpu10_window_s), (30, s.cpu30_window_s))
    }

    log(f"RSS over {s.churn_cycles} cycles with MIG churn, without and with pods (in parallel)")
    churn_args = [str(paths[target.name]), "--every", str(s.churn_every), "--no-latency"]
    churn_args += ["--cycles", str(s.churn_cycles), "--sample", str(s.churn_sample)]
    churn_args += ["--warmup", str(s.churn_warmup)]
    # RSS does not depend on CPU contention, so the two runs share the cores.
    res["churn"], res["churn_pods"] = _children(
        ("benchmarks.churn", churn_args),
        ("benchmarks.churn", [*churn_args, "--pods", str(s.pod_counts[0])]),
    )
    if s.trace_cycles:
        log(f"  heap growth by file (tracemalloc, {s.trace_cycles} cycles)")
        trace_args = [str(paths[target.name]), "--every", str(s.churn_every), "--no-latency"]
        trace_args += ["--cycles", str(s.trace_cycles), "--sample", str(s.trace_cycles)]
        trace_args += ["--warmup", str(s.churn_warmup), "--trace"]
        res["churn_trace"] = _child("benchmarks.churn", *trace_args)

    log(f"collection cycle, in-process, {target.name}, a third time")
    target_cycles.append(cycle(target))
    res["cycle_target_runs"] = target_cycles  # the last is the peer's neighbour in time
    res["cycle"][target.name] = min(target_cycles, key=lambda c: c["net_ms"])

    res["peer"] = None
    if with_peer:
        log("side by side: nvitop-exporter on the same node")
        try:
            res["peer"] = measure_peer(target, paths[target.name], work, s, log)
        except peer.PeerUnavailable as e:
            res["peer"] = {"error": str(e)}
    res["target"] = target.name
    res["fleets"] = {c.name: {"gpus": c.gpus, "mig": c.mig} for c in cases}
    res["machine"]["load_after"] = os.getloadavg()
    res["seconds"] = time.monotonic() - t_start
    return res
