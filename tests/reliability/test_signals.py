"""SIGTERM and SIGHUP, end to end.

SIGTERM: the exporter exits with status 0 within 5 s, whatever it is doing: holding
idle and half-sent connections, serving scrapes, stuck in an NVML call, waiting on a
slow kubelet. SIGHUP: the metrics file and the web config are reloaded while a
scraper hammers /metrics, and every response is a complete exposition of either the
old or the new metrics file, never a mix, never empty.
"""

from __future__ import annotations

import gzip
import http.client
import shutil
import signal
import threading
import time

from exporter.config.model import default_metrics_file
from tests.procs import ROOT, Exporter, wait_until
from tests.support.exposition import samples
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FIXTURES = ROOT / "tests" / "fixtures" / "reliability"

STOP_S = 5.0


def families(text: str) -> frozenset[str]:
    return frozenset(
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE DCGM_")
    )


def test_sigterm_with_connections_open_and_scrapes_in_flight(tmp_path):
    node = Exporter("-c", "300", log=tmp_path / "log")
    node.wait_ready()
    idle, slow = [], []
    for _ in range(50):
        c = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
        c.request("GET", "/metrics")
        c.getresponse().read()
        idle.append(c)  # a keep-alive connection, waiting for its next request
        s = node.connect()
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        slow.append(s)
    stop = threading.Event()
    errors: list[BaseException] = []

    def hammer() -> None:
        while not stop.is_set():
            try:
                c = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
                c.request("GET", "/metrics")
                c.getresponse().read()
                c.close()
            except OSError:
                return  # the exporter went away: expected from here on
            except BaseException as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    try:
        took = node.terminate(timeout=STOP_S * 2)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for c in idle:
            c.close()
        for s in slow:
            s.close()
    assert node.proc.returncode == 0, node.output()[-2000:]
    assert took < STOP_S, took
    assert not errors, errors
    print(f"\nSIGTERM with 100 connections open and 4 scrapers: exit 0 after {took:.2f} s")


def test_sigterm_during_a_hung_nvml_call(tmp_path):
    """Python waits for worker threads at exit; a thread stuck in an NVML call would
    keep the pod in Terminating until SIGKILL. The exporter leaves without it."""
    fleet = tmp_path / "hang.yaml"
    fleet.write_text((FIXTURES / "hang.yaml").read_text().replace("seconds: 60", "seconds: 600"))
    node = Exporter("-c", "300", "--collect-timeout", "500", fleet=fleet, log=tmp_path / "log")
    node.wait_ready()
    wait_until(lambda: b"busy reading GPU 2" in node.get("/ready")[2], 15, "the hang")
    took = node.terminate(timeout=STOP_S * 2)
    assert node.proc.returncode == 0
    assert took < STOP_S, took
    assert "exiting while an NVML call is still running (GPU 2" in node.output()
    print(f"\nSIGTERM during a hung NVML call: exit 0 after {took:.2f} s")


def test_sigterm_while_the_kubelet_is_slow(tmp_path):
    kubelet = FakeKubelet(tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None)))
    kubelet.start()
    try:
        node = Exporter(
            "-c",
            "300",
            "-k",
            "--pod-resources-kubelet-socket",
            str(kubelet.socket_path),
            log=tmp_path / "log",
        )
        node.wait_ready()
        kubelet.mode, kubelet.delay = "slow", 30.0
        calls = kubelet.calls
        wait_until(lambda: kubelet.calls > calls, 10, "a List in flight")
        took = node.terminate(timeout=STOP_S * 2)
        assert node.proc.returncode == 0
        assert took < STOP_S, took
    finally:
        kubelet.close()
    print(f"\nSIGTERM with a kubelet List in flight: exit 0 after {took:.2f} s")


class Scraper(threading.Thread):
    """Scrapes /metrics back to back and checks that each answer is whole."""

    def __init__(self, port: int, gzipped: bool, allowed: list[frozenset[str]]) -> None:
        super().__init__(daemon=True)
        self.port, self.gzipped, self.allowed = port, gzipped, allowed
        self.stop = threading.Event()
        self.seen: dict[frozenset[str], int] = {}
        self.bad: list[str] = []
        self.headers: list[tuple[float, str]] = []

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        headers = {"Accept-Encoding": "gzip"} if self.gzipped else {}
        while not self.stop.is_set():
            try:
                conn.request("GET", "/metrics", headers=headers)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as e:
                self.bad.append(f"request failed: {e!r}")
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                continue
            self.headers.append((time.monotonic(), resp.getheader("X-Frame-Options", "")))
            self.check(resp, body)

    def check(self, resp: http.client.HTTPResponse, body: bytes) -> None:
        if resp.status != 200 or int(resp.getheader("Content-Length", "-1")) != len(body):
            self.bad.append(f"status {resp.status}, {len(body)} bytes")
            return
        if self.gzipped:
            body = gzip.decompress(body)
        text = body.decode()
        try:
            samples(text)  # every line a valid sample or comment
        except AssertionError as e:
            self.bad.append(str(e))
            return
        fams = families(text)
        if fams not in self.allowed or "process_start_time_seconds" not in text:
            self.bad.append(f"families {sorted(fams)[:3]}..., {len(fams)} of them")
            return
        self.seen[fams] = self.seen.get(fams, 0) + 1


def test_sighup_reloads_while_scrapes_stay_whole(tmp_path):
    metrics = tmp_path / "metrics.csv"
    shutil.copy(default_metrics_file(), metrics)
    full = metrics.read_text()
    fewer = full.replace("DCGM_FI_DEV_GPU_TEMP,", "# DCGM_FI_DEV_GPU_TEMP,").replace(
        "DCGM_FI_DEV_SM_CLOCK,", "# DCGM_FI_DEV_SM_CLOCK,"
    )
    assert fewer.count("# DCGM_FI_DEV_GPU_TEMP,") == 1 and fewer.count("# DCGM_FI_DEV_SM_CLOCK,")
    web = tmp_path / "web.yaml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    node = Exporter(
        "-c", "300", "-f", str(metrics), "--web-config-file", str(web), log=tmp_path / "log"
    )
    node.wait_ready()
    text = node.wait_metrics(lambda t: "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in t, 10, "GPM values")
    fam_full = families(text)
    fam_fewer = fam_full - {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"}
    allowed = [fam_full, fam_fewer]
    scrapers = [Scraper(node.port, gzipped=i % 2 == 1, allowed=allowed) for i in range(4)]
    for s in scrapers:
        s.start()

    def showing(fams: frozenset[str]) -> bool:
        return families(node.metrics()) == fams

    def hup() -> float:
        node.proc.send_signal(signal.SIGHUP)
        return time.monotonic()

    try:
        time.sleep(0.5)
        # fewer rows and another header, on one SIGHUP
        metrics.write_text(fewer)
        web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n")
        sent = hup()
        wait_until(lambda: showing(fam_fewer), 5, "the reloaded metrics file")
        took = time.monotonic() - sent
        wait_until(lambda: node.get("/")[1].get("X-Frame-Options") == "sameorigin", 2, "header")
        time.sleep(0.5)
        # a broken file: refused, the last good one stays
        metrics.write_text(fewer + "DCGM_FI_DEV_NO_SUCH_FIELD, gauges, nothing\n")
        hup()
        wait_until(lambda: "DCGM_FI_DEV_NO_SUCH_FIELD" in node.output(), 5, "the error logged")
        time.sleep(1.0)
        assert showing(fam_fewer)
        refused = 'gpu_exporter_config_last_reload_successful{file="metrics_file"} 0.0'
        wait_until(lambda: refused in node.metrics(), 5, "the refused reload in a self-metric")
        # back to the full file, then a burst of SIGHUPs
        metrics.write_text(full)
        hup()
        wait_until(lambda: showing(fam_full), 5, "the full metrics file again")
        loaded = refused.replace("} 0.0", "} 1.0")
        wait_until(lambda: loaded in node.metrics(), 5, "the good reload in a self-metric")
        for _ in range(20):
            hup()
            time.sleep(0.02)
        time.sleep(1.0)
    finally:
        for s in scrapers:
            s.stop.set()
        for s in scrapers:
            s.join(10)
    assert node.proc.poll() is None, node.output()[-2000:]
    log = node.stop()
    bad = [b for s in scrapers for b in s.bad]
    assert not bad, bad[:5]
    seen: dict[frozenset[str], int] = {}
    for s in scrapers:
        for k, n in s.seen.items():
            seen[k] = seen.get(k, 0) + n
    assert seen.get(fam_full, 0) > 10 and seen.get(fam_fewer, 0) > 10, seen.values()
    assert took <= 1.5  # the next cycle (0.3 s), plus reading the file, on a busy machine
    assert "still collecting with the last good metrics file" in log
    assert "DCGM_FI_DEV_NO_SUCH_FIELD: unknown metric type 'gauges'" in log
    print(
        f"\nSIGHUP: {sum(seen.values())} scrapes during 3 reloads, a refused file and 20 more "
        f"SIGHUPs, all complete; new metrics file served {took:.2f} s after SIGHUP"
    )


def test_sighup_without_a_web_config_is_harmless(tmp_path):
    """SIGHUP's default action is to end the process: the exporter always handles it."""
    node = Exporter("-c", "300", log=tmp_path / "log")
    node.wait_ready()
    node.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert node.proc.poll() is None
    assert node.get("/metrics")[0] == 200
    assert "metrics file" in node.stop()
