"""Attack soak: the real exporter under a rotating mix of attacks, with a legitimate
scraper throughout.

    python3 -m tests.reliability.attack_soak [--minutes 10] [--write-doc]   (prints JSON)

The exporter runs as a process (benchmarks/procs.py, through tests/procs.py) on a simulated node
(tests/fixtures/reliability/soak.yaml: 2 whole GPUs, 11 MIG instances) with TLS and
basic auth (bcrypt cost 10), ``-k`` against a fake kubelet (real gRPC on a unix
socket) and ``--kubernetes-enable-pod-labels`` against a hostile API server stub whose
watches churn pod labels all the time. XID events (on whole GPUs and MIG instances)
and two refused driver unloads are faults in the fleet file. The attacks of
tests/reliability/attacks.py take turns; between rounds the attackers' connections
are given time to be cut off and a quiet sample is taken.

Recorded: RSS, open fds and threads every 10 s; every scrape's latency, devices,
pod labels, collection timestamp and XID counts; log lines and tracebacks.
tests/reliability/test_attack_soak.py runs a 60 s version and asserts the verdict.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from exporter.config.model import default_metrics_file
from exporter.runtime import heap
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from tests.procs import ROOT, Exporter
from tests.reliability import attack_report, attacks
from tests.support.certs import CA
from tests.support.exposition import find
from tests.support.fakekubelet import FakeKubelet, fleet_ids
from tests.support.hostileapi import HostileAPIServer

FIXTURES = ROOT / "tests" / "fixtures" / "reliability"
DOC = ROOT / "docs" / "reliability.md"
ENTITIES = 2 + 4 + 7  # whole GPUs 0 and 1, MIG instances of GPUs 2 and 3
OUTAGE_S = 3.0
MAX_CONNECTIONS = attack_report.MAX_CONNECTIONS
LOG_LINE = re.compile(r"^\S+ (\d\d:\d\d):\d\d,\d+ \w+ ([\w.]+):", re.M)  # minute, logger
FLAGS = ("-c", "1000", "--max-connections", str(MAX_CONNECTIONS), "--http-timeout", "2000",
         "--http-write-timeout", "1500", "--kubernetes-enable-pod-labels")  # fmt: skip


def schedule(seconds: float, ids: dict[str, str]) -> tuple[list[dict], list[float], Counter]:
    """Fleet faults: an XID every 2 s (whole GPUs and MIG instances in turn; 79 through
    the kernel log), and two attempts to unload the driver, which Linux refuses while the
    exporter holds NVML (nothing may change); (faults, outage starts: none, XIDs expected
    by (gpu, xid))."""
    migs = [(int(g), int(gi)) for g, gi in (k.split(":")[1:] for k in ids if k.startswith("mig:"))]
    faults: list[dict] = [
        {"at": round(seconds * share), "kind": "driver_unloaded", "duration": OUTAGE_S}
        for share in (0.4, 0.8)
    ]
    expected: Counter = Counter()
    for k, at in enumerate(range(12, int(seconds) - 12, 2)):
        xid = (13, 31, 43, 79, 94)[k % 5]
        if k % 2:
            gpu, gi = migs[k % len(migs)]
            faults.append({"at": at, "kind": "xid", "gpu": gpu, "xid": xid, "gi": gi, "count": 2})
        else:
            gpu = k % 4 // 2  # 0, 0, 1, 1, ...: whole GPUs only
            faults.append({"at": at, "kind": "xid", "gpu": gpu, "xid": xid, "count": 2})
        expected[(str(gpu), str(xid))] += 2
    return faults, [], expected


def kubelet_pods(ids: dict[str, str]) -> pb.ListPodResourcesResponse:
    """Pod p-N holds device N: GPUs 0 and 1, then each MIG instance."""
    devices = [ids["gpu:0"], ids["gpu:1"]] + [v for k, v in sorted(ids.items()) if "mig:" in k]
    resp = pb.ListPodResourcesResponse()
    for i, device in enumerate(devices):
        c = resp.pod_resources.add(name=f"p-{i}", namespace="ns").containers.add(name="main")
        resource = "nvidia.com/gpu" if device.startswith("GPU-") else "nvidia.com/mig-1g.10gb"
        c.devices.add(resource_name=resource, device_ids=[device])
    return resp


@dataclass
class Scrape:
    t: float
    status: int
    seconds: float
    nvml_up: float = -1
    devices: int = 0
    pod_labels: bool = False
    age: float = 0.0  # seconds since the last successful collection, at the scrape
    xids: dict[str, int] = field(default_factory=dict)


@dataclass
class Proc:
    t: float
    rss_mib: float
    fds: int
    threads: int
    log_lines: int
    quiet: bool = False
    after: str = ""  # the attack just over


class Scraper(threading.Thread):
    """Prometheus: /metrics over TLS with the right password every second."""

    def __init__(self, port: int, ctx: ssl.SSLContext, t0: float) -> None:
        super().__init__(daemon=True, name="scraper")
        self.port, self.ctx, self.t0 = port, ctx, t0
        self.stop = threading.Event()
        self.scrapes: list[Scrape] = []

    def once(self) -> Scrape:
        start = time.monotonic()
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5, context=self.ctx)
        try:
            conn.request(
                "GET", "/metrics", headers={"Authorization": attacks.basic("prom", "secret")}
            )
            resp = conn.getresponse()
            body = resp.read().decode()
            status = resp.status
        except (OSError, ssl.SSLError):
            body, status = "", 0
        finally:
            conn.close()
        s = Scrape(start - self.t0, status, time.monotonic() - start)
        if status == 200:
            up = find(body, "gpu_exporter_nvml_up")
            s.nvml_up = up[0].value if up else -1
            fb = find(body, "DCGM_FI_DEV_FB_USED")
            s.devices = len({(x.labels["gpu"], x.labels.get("GPU_I_ID", "")) for x in fb})
            s.pod_labels = all(x.labels.get("pod", "").startswith("p-") for x in fb)
            ts = find(body, "gpu_exporter_last_collection_success_timestamp_seconds")
            s.age = round(time.time() - ts[0].value, 2) if ts else -1.0
            xids: Counter = Counter()
            for x in find(body, "DCGM_EXP_XID_ERRORS_TOTAL"):
                xids[f"{x.labels['gpu']}/{x.labels['xid']}"] += int(x.value)
            s.xids = dict(xids)
        return s

    def run(self) -> None:
        while not self.stop.is_set():
            self.scrapes.append(self.once())
            self.stop.wait(max(0.0, 1.0 - self.scrapes[-1].seconds))


class Soak:
    """Sets the node up in ``tmp``, runs the rotation for ``seconds``, tears down."""

    def __init__(self, tmp: Path, seconds: float) -> None:
        self.tmp, self.seconds = tmp, seconds
        ca = CA("soak")
        ca.issue("gpu-exporter", server=True).write(tmp, "tls.crt", "tls.key")
        (tmp / "ca.crt").write_bytes(ca.pem)
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.check_hostname = False
        hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(10)).decode()
        web = tmp / "web.yaml"
        web_text = (
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
            f"basic_auth_users:\n  prom: {hashed}\n"
        )
        web.write_text(web_text)
        metrics = tmp / "metrics.csv"
        metrics_text = Path(default_metrics_file()).read_text()
        metrics.write_text(metrics_text)
        fleet = yaml.safe_load((FIXTURES / "soak.yaml").read_text())
        ids = fleet_ids(FIXTURES / "soak.yaml")
        fleet["faults"], self.outages, self.expected = schedule(seconds, ids)
        (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        good = kubelet_pods(ids)
        self.kubelet = FakeKubelet(tmp / "kubelet.sock", good).start()
        api = HostileAPIServer().__enter__()
        # a watch the exporter cut off (as it should) is not worth a traceback here
        api._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.t0 = time.monotonic()
        self.node = Exporter(
            *FLAGS, "-f", str(metrics), "--web-config-file", str(web), "-k",
            "--pod-resources-kubelet-socket", str(tmp / "kubelet.sock"), fleet=tmp / "fleet.yaml",
            env={"NODE_NAME": "node-a", "KUBERNETES_SERVICE_HOST": "",
                 "KUBECONFIG": str(kubeconfig(tmp / "kubeconfig", api.url))},
            log=tmp / "log",
        )  # fmt: skip
        self.target = attacks.Target(
            self.node.port, self.node.proc.pid, self.ctx, web, web_text, metrics, metrics_text,
            self.kubelet, good, api, len(good.pod_resources),
        )  # fmt: skip
        attacks.start_api(self.target)
        self.procs: list[Proc] = []

    def sample(self, quiet: bool = False, after: str = "") -> Proc:
        lines = self.node.output().count("\n")
        p = Proc(time.monotonic() - self.t0, self.node.rss_mib(), self.node.open_files(),
                 self.node.threads(), lines, quiet, after)  # fmt: skip
        self.procs.append(p)
        return p

    def settle(self, fds: int) -> None:
        """Waits (at most 8 s) for the attackers' connections to be cut off."""
        end = time.monotonic() + 8
        while time.monotonic() < end and self.node.open_files() > fds:
            time.sleep(0.2)

    def run(self) -> dict[str, Any]:
        while time.monotonic() - self.t0 < 30 and self.node.proc.poll() is None:
            if Scraper(self.node.port, self.ctx, self.t0).once().devices == ENTITIES:
                break
            time.sleep(0.5)
        time.sleep(3)  # the pod watcher's first list and watch are in
        base = self.sample(quiet=True)
        scraper = Scraper(self.node.port, self.ctx, self.t0)
        scraper.start()
        monitor = threading.Thread(target=self._monitor, args=(scraper.stop,), daemon=True)
        monitor.start()
        end = self.t0 + self.seconds
        n = len(attacks.ATTACKS)
        rounds = max(2, round((end - time.monotonic()) / (n * 30)))
        per = (end - time.monotonic()) / rounds / n
        gap = min(2.5, per / 4)  # 2.5 s: past --http-timeout, the attackers are cut off
        phase = per - gap
        for attack in [a for _ in range(rounds) for a in attacks.ATTACKS]:
            if self.node.proc.poll() is not None:
                break
            attack(self.target, time.monotonic() + phase)
            self.target.note(attack.__name__ + "_phases")
            self.sample(after=attack.__name__)
            if attack is attacks.ATTACKS[-1]:
                self.settle(base.fds + 2)
                time.sleep(heap.TRIM_S + 1)  # what the round freed has been handed back
                self.sample(quiet=True)
            else:
                time.sleep(gap)
        time.sleep(3)  # the last XIDs are counted
        scraper.stop.set()
        scraper.join(10)
        monitor.join(15)
        return self.result(scraper.scrapes)

    def _monitor(self, stop: threading.Event) -> None:
        while not stop.wait(10) and self.node.proc.poll() is None:
            self.sample()

    def result(self, scrapes: list[Scrape]) -> dict[str, Any]:
        log = self.node.output()
        return {
            "seconds": round(time.monotonic() - self.t0, 1),
            "alive": self.node.proc.poll() is None,
            "entities": ENTITIES,
            "outages": self.outages,
            "xid_expected": {f"{g}/{x}": n for (g, x), n in sorted(self.expected.items())},
            "attacks": dict(sorted(self.target.counts.items())),
            "tracebacks": log.count("Traceback"),
            "log_minutes": [m.groups() for m in LOG_LINE.finditer(log)],
            "log": log[-200_000:],
            "log_tail": log.splitlines()[-30:],
            "procs": [asdict(p) for p in self.procs],
            "scrapes": [asdict(s) for s in scrapes],
        }

    def close(self) -> None:
        self.node.stop()
        self.kubelet.close()
        self.target.api.__exit__(None, None, None)


def kubeconfig(path: Path, url: str) -> Path:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "stub",
        "clusters": [{"name": "stub", "cluster": {"server": url}}],
        "users": [{"name": "exporter", "user": {"token": "t"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "exporter"}}],
    }  # fmt: skip
    path.write_text(json.dumps(cfg))
    return path


def soak(seconds: float) -> dict[str, Any]:
    """Runs the attack soak for ``seconds``; the raw record (see :func:`verdict`)."""
    with tempfile.TemporaryDirectory(prefix="attack-soak-") as tmp:
        s = Soak(Path(tmp), seconds)
        try:
            return s.run()
        finally:
            s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--write-doc", action="store_true", help="write the figures into the doc")
    p.add_argument("--raw", type=Path, help="also write the whole record (JSON) here")
    p.add_argument("--from-raw", type=Path, help="no run: the figures of a record written before")
    args = p.parse_args(argv)
    record = json.loads(args.from_raw.read_text()) if args.from_raw else soak(args.minutes * 60)
    if args.raw:
        args.raw.write_text(json.dumps(record, indent=1))
    s = attack_report.summary(record)
    failed = attack_report.verdict(s)
    print(json.dumps({**s, "verdict": failed or "held"}, indent=1))
    if args.write_doc and not failed:
        attack_report.write_doc(s, DOC)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
