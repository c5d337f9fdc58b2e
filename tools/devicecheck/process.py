"""The exporter as users run it, collecting every second: CPU per cycle and memory.

``python -m exporter -c 1000`` with the shipped metrics file runs for a warm-up and a
measured window; CPU per cycle is the CPU of the process's threads over the window (from
/proc, in ns) divided by the cycles completed in it (``gpu_exporter_collections_total``), RSS
is VmRSS at the end and VmHWM its peak. On a GPU node it runs once on the real driver
and once on the simulator with a node like this one (same models where the simulator
knows them, an H100 otherwise), so the two columns compare the same work.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.procs import Process, free_port, proc_status, thread_cpu
from exporter.nvml.devices import Device
from exporter.sim.models import catalog

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
_COLLECTIONS = re.compile(r'^gpu_exporter_collections_total\{result="success"\} (\S+)$', re.M)


def mirror_fleet(gpus: list[Device], driver: str, path: Path) -> Path:
    """A fleet file with one simulated GPU per real one (its model if known), latency on."""
    known = catalog()
    fleet = {
        "hostname": "device-check-mirror",
        "driver_version": driver or "580.95.05",
        "latency": {"enabled": True},
        "gpus": [{"model": g.model if g.model in known else DEFAULT_MODEL} for g in gpus],
    }
    path.write_text(yaml.safe_dump(fleet), encoding="utf-8")
    return path


def _collections(proc: Process) -> float:
    status, _, body = proc.get("/metrics", timeout=10)
    found = _COLLECTIONS.search(body.decode()) if status == 200 else None
    return float(found.group(1)) if found else 0.0


def _cpu(pid: int) -> float:
    """CPU seconds of the process's threads, in ns where the kernel keeps them (a process's
    own figure moves in 10 ms ticks, as much as a cycle costs)."""
    return sum(cpu for _, cpu in thread_cpu(pid).values())


def measure(
    simulate: Path | None, seconds: float, log: Path, library_dir: str | None = None
) -> dict[str, Any]:
    """CPU ms per cycle and RSS MiB of one exporter process collecting every second
    (``library_dir``: where libnvidia-ml.so.1 is, when the loader does not find it)."""
    port = free_port()
    sim = ["--simulate", str(simulate)] if simulate else []
    argv = [sys.executable, "-m", "exporter", *sim, "-a", f"127.0.0.1:{port}", "-c", "1000"]
    env = {"LD_LIBRARY_PATH": library_dir} if library_dir else None
    with Process([*argv, "--log-level", "warning"], port, env=env, log=log) as proc:
        proc.wait_http("/ready", timeout=60)
        time.sleep(3.0)  # warm-up: first cycles, imports, GPM and rate priming
        c0, n0, t0 = _cpu(proc.pid), _collections(proc), time.monotonic()
        time.sleep(seconds)
        c1, n1, t1 = _cpu(proc.pid), _collections(proc), time.monotonic()
        rss = proc.rss_mib()
        peak = proc_status(proc.pid, "VmHWM") / 1024
    cycles = max(n1 - n0, 1.0)
    return {
        "driver": "simulated" if simulate else "real",
        "window_s": round(t1 - t0, 1),
        "cycles": int(cycles),
        "cpu_ms_per_cycle": round((c1 - c0) * 1e3 / cycles, 2),
        "cpu_percent": round((c1 - c0) / (t1 - t0) * 100, 2),
        "rss_mib": round(rss, 1),
        "peak_rss_mib": round(peak, 1),
    }
