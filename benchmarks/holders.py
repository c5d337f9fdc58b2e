"""Many live accounting holders, end to end: the exporter process, a real kubelet, scrapes.

    python -m benchmarks.holders [--holders 20000] [--seconds 60] [--fleet FLEET.yaml]
        [-c 1000] [--per-pod 100]                               (prints JSON)

The red team's setup for "N live accounting holders": ``gpu-exporter --simulate``
(the default 8-GPU node unless ``--fleet``) with ``-c 1000 -k`` against
benchmarks/kubelet.py (pod-resources v1 over gRPC on a unix socket, a process of its
own) whose ``List`` answer has ``--holders`` containers, ``--per-pod`` to a pod, each
holding one time-sliced replica (``<uuid>::<n>``) of the node's devices in turn (MIG
instances and whole GPUs, as the device plugin hands them out), so every device is
shared and every container is a holder; ``GetAllocatableResources`` advertises every
replica held. Nothing changes during the run: all holders stay live.

While it runs: RSS (VmRSS) sampled 20 times a second; ``/metrics`` with gzip every
100 ms (one connection each, as a plain HTTP client does), its latency timed and, every
``PARSE_EVERY``-th body, the self-metrics read: collections by result, the time of the
last successful one, holders dropped by reason. Reported: RSS peak (and the kernel's
high-water mark) and steady (median of the second half), collection spacing (from the
distinct success timestamps seen and the success counter's rate), scrape latency
p50/p99/max, the holders served (per-holder ``allocated`` series with a pod label), the
exporter's CPU, and the load average before and after (the host is shared).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.churn import kubelet_process
from benchmarks.pods import RESOURCE, device_ids
from benchmarks.procs import Exporter, cpu_rates, ours, wait_until

RSS_EVERY_S = 0.05
SCRAPE_EVERY_S = 0.1
PARSE_EVERY = 5  # bodies: one in five decompressed and read (0.5 s apart)
DEFAULT_FLEET = Path(__file__).resolve().parent.parent / "exporter/sim/fleets/default.yaml"
# self-metrics lines a sample reads: (key, the line's start up to its value)
_SELF = tuple(
    (key, b"\ngpu_exporter_" + line + b" ")
    for key, line in (
        ("success", b'collections_total{result="success"}'),
        ("failure", b'collections_total{result="failure"}'),
        ("skipped", b'collections_total{result="skipped"}'),
        ("last_success", b"last_collection_success_timestamp_seconds"),
        ("dropped_limit", b'accounting_holders_dropped_total{reason="limit"}'),
        ("dropped_retention", b'accounting_holders_dropped_total{reason="retention"}'),
    )
)
_HOLDER = re.compile(rb'^gpu_exporter_allocated_gpu_seconds_total\{[^}]*pod="[^"]', re.M)


def answer(ids: list[str], holders: int, per_pod: int) -> dict[str, Any]:
    """A List answer (benchmarks/kubelet.py's JSON) of ``holders`` containers, ``per_pod``
    to a pod, container k holding replica k // len(ids) of device k % len(ids)."""
    pods = []
    for p in range(-(-holders // per_pod)):
        containers = []
        for k in range(p * per_pod, min(holders, (p + 1) * per_pod)):
            rid = f"{ids[k % len(ids)]}::{k // len(ids)}"
            dev = {"resource_name": RESOURCE, "device_ids": [rid]}
            containers.append({"name": f"c{k - p * per_pod:03d}", "devices": [dev]})
        pods.append({"name": f"holders-{p:04d}", "namespace": "bench", "containers": containers})
    return {"pod_resources": pods}


def self_metrics(body: bytes) -> dict[str, float]:
    """The self-metrics a sample reads from one exposition (plain text); a few searches,
    not a parse, so that the sampler's CPU stays small beside the exporter's."""
    out: dict[str, float] = {}
    for key, start in _SELF:
        at = body.find(start)
        if at >= 0:
            at += len(start)
            out[key] = float(body[at : body.index(b"\n", at)])
    return out


class Sampler:
    """RSS 20 times a second and a gzip scrape every 100 ms, each in a thread of its own."""

    def __init__(self, exporter: Exporter) -> None:
        self.exp = exporter
        self.stop = threading.Event()
        self.rss: list[tuple[float, float]] = []  # (monotonic s, MiB)
        self.scrapes: list[tuple[float, float, int]] = []  # (monotonic s, latency s, bytes)
        self.failed: list[str] = []
        self.reads: list[tuple[float, dict[str, float]]] = []
        self.last_body = b""
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._rss, self._get)]

    def __enter__(self) -> Sampler:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(15)

    def _rss(self) -> None:
        while not self.stop.wait(RSS_EVERY_S):
            try:
                self.rss.append((time.monotonic(), self.exp.rss_mib()))
            except OSError:
                return

    def _get(self) -> None:
        n = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                status, _, body = self.exp.get("/metrics", {"Accept-Encoding": "gzip"}, 10.0)
            except OSError as e:
                self.failed.append(repr(e)[:120])
                status, body = 0, b""
            took = time.monotonic() - t0
            if status == 200:
                self.scrapes.append((t0, took, len(body)))
                if n % PARSE_EVERY == 0:
                    self.last_body = gzip.decompress(body)
                    self.reads.append((t0, self_metrics(self.last_body)))
                n += 1
            elif status:
                self.failed.append(f"HTTP {status}")
            self.stop.wait(max(0.0, SCRAPE_EVERY_S - took))


def families(body: bytes, top: int = 6) -> dict[str, int]:
    """Series per family in one exposition, the ``top`` largest."""
    names = Counter(
        line.split(b"{")[0].split(b" ")[0] for line in body.splitlines() if line[:1] != b"#"
    )
    return {k.decode(): v for k, v in names.most_common(top)}


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(s: Sampler, t_start: float) -> dict[str, Any]:
    """The figures of one run from its samples."""
    rss = [v for t, v in s.rss]
    steady = [v for t, v in s.rss if t >= t_start + (s.rss[-1][0] - t_start) / 2] if rss else []
    lat = [x[1] for x in s.scrapes]
    stamps = sorted({r.get("last_success", 0.0) for _, r in s.reads} - {0.0})
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    first, last = s.reads[0], s.reads[-1]
    rate = (last[1].get("success", 0) - first[1].get("success", 0)) / max(1e-9, last[0] - first[0])
    return {
        "rss_mib": {
            "peak": round(max(rss), 1),
            "steady_median": round(statistics.median(steady), 1),
            "first": round(rss[0], 1),
            "samples": len(rss),
        },
        "cycles": {
            "per_s": round(rate, 3),
            "spacing_s_median": round(statistics.median(gaps), 3) if gaps else None,
            "spacing_s_max": round(max(gaps), 3) if gaps else None,
            "spacing_s": [round(g, 2) for g in gaps],
            "results": {k: last[1].get(k) for k in ("success", "failure", "skipped")},
        },
        "scrape_s": {
            "p50": round(_q(lat, 0.5), 4),
            "p99": round(_q(lat, 0.99), 4),
            "max": round(max(lat), 4),
            "n": len(lat),
            "over_1s": sum(1 for x in lat if x > 1.0),
            "failed": len(s.failed),
            "gzip_bytes_last": s.scrapes[-1][2],
        },
        "holders_served": len(_HOLDER.findall(s.last_body)),
        "plain_bytes_last": len(s.last_body),
        "series_top": families(s.last_body),
        "dropped": {k[8:]: v for k, v in last[1].items() if k.startswith("dropped_")},
    }


def run_queue_s(pid: int) -> float:
    """Seconds the threads of ``pid`` (those alive now) have waited for a CPU while
    runnable (/proc/.../schedstat's second field): how much a busy host held it back."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _served(exp: Exporter) -> bool:
    """Whether the exposition has a holder's series (gzip: the plain one is megabytes)."""
    status, _, body = exp.get("/metrics", {"Accept-Encoding": "gzip"}, 10.0)
    return status == 200 and bool(_HOLDER.search(gzip.decompress(body)))


def log_kinds(output: str) -> dict[str, int]:
    """The exporter's log lines by kind: the message's start, numbers and IDs as N."""
    kinds = Counter(
        re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)?", "N", line[24:])[:110]
        for line in output.splitlines()
    )
    return dict(kinds.most_common(8))


def run(fleet: Path, holders: int, seconds: float, interval_ms: int, per_pod: int) -> dict:
    """Start the kubelet and the exporter, sample for ``seconds`` once it serves holders."""
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-holders-") as tmp:
        work = Path(tmp)
        sock, pods_file = work / "kubelet.sock", work / "pods.json"
        pods_file.write_text(json.dumps(answer(device_ids(fleet), holders, per_pod)))
        kubelet = kubelet_process(sock, pods_file)
        flags = ["-k", "--pod-resources-kubelet-socket", str(sock)]
        try:
            exp = ours(fleet, interval_ms, work / "exporter.log", flags)
            with exp:
                t0 = time.monotonic()
                wait_until(lambda: _served(exp), 180, "holders served", interval=0.5)
                first_s = time.monotonic() - t0
                t1, wait0 = time.monotonic(), run_queue_s(exp.pid)
                with Sampler(exp) as s:
                    cpu = cpu_rates(exp, seconds)  # CPU s per s: the process, by thread group
                waited = (run_queue_s(exp.pid) - wait0) / (time.monotonic() - t1)
                hwm = exp.status("VmHWM") / 1024
            log = exp.output()
        finally:
            kubelet.stop()
        answer_bytes = pods_file.stat().st_size
    out = {
        "holders_listed": holders,
        "per_pod": per_pod,
        "fleet": str(fleet),
        "interval_ms": interval_ms,
        "seconds": seconds,
        "first_holders_s": round(first_s, 2),
        "list_answer_json_bytes": answer_bytes,
        **summary(s, t1),
        "exporter_cpu_cores": {k: round(v, 3) for k, v in cpu.items()},
        "exporter_run_queue_wait_per_s": round(waited, 3),
        "log": log_kinds(log),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    out["rss_mib"]["vmhwm"] = round(hwm, 1)
    if out["cycles"]["per_s"]:
        out["cycles"]["cpu_s_each"] = round(cpu["process"] / out["cycles"]["per_s"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.holders", description=__doc__)
    p.add_argument("--holders", type=int, default=20000)
    p.add_argument("--seconds", type=float, default=60.0, help="sampling, after holders appear")
    p.add_argument("--fleet", type=Path, default=DEFAULT_FLEET)
    p.add_argument("-c", dest="interval_ms", type=int, default=1000)
    p.add_argument("--per-pod", type=int, default=100, help="containers per pod (kubelet: 128)")
    a = p.parse_args(argv)
    json.dump(run(a.fleet, a.holders, a.seconds, a.interval_ms, a.per_pod), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
