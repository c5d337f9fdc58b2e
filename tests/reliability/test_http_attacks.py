"""Attacks on the HTTP layer and the config files, against the real exporter process.

Each test floods the exporter from 127.0.0.1 with one attack (TLS handshakes that never
finish, oversized headers, clients that never read, slowloris, wrong passwords after a
reload, a truncated web config, a FIFO as the metrics file, a SIGHUP storm) and checks
what a user would: a legitimate scrape answers within 1 s (for connection floods: within
1 s of the attackers being cut off), RSS stays under 96 MiB, open fds stay bounded,
collection keeps publishing fresh cycles, and the log grows by a few lines without a
traceback. The bounds are docs/security.md's.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from tests.procs import Exporter, http_get, wait_until
from tests.support.certs import CA

RSS_MIB = 96
FRESH = re.compile(rb"^gpu_exporter_last_collection_success_timestamp_seconds (\S+)$", re.M)


class Baseline:
    """What the exporter looked like before the attack: log lines and open fds."""

    def __init__(self, node: Exporter, auth: str | None = None) -> None:
        self.node = node
        self.auth = auth
        self.lines = len(node.output().splitlines())
        self.fds = node.open_files()
        self.stamp = self.collected()

    def collected(self) -> float:
        status, body = scrape(self.node, auth=self.auth)
        assert status == 200
        m = FRESH.search(body)
        assert m, "no collection timestamp in the exposition"
        return float(m.group(1))

    def check(self, extra_lines: int = 4) -> None:
        """Bounded memory, fresh cycles, a quiet log, no traceback."""
        node = self.node
        assert node.proc.poll() is None, node.output()[-2000:]
        assert node.rss_mib() < RSS_MIB
        wait_until(lambda: self.collected() > self.stamp, 5, "a fresh cycle")
        log = node.output()
        assert "Traceback" not in log, log[-3000:]
        grown = log.splitlines()[self.lines :]
        assert len(grown) <= extra_lines, grown


def scrape(node: Exporter, ctx: ssl.SSLContext | None = None, auth: str | None = None):
    """(status, body) of /metrics, over TLS with ``ctx``."""
    import http.client

    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", node.port, timeout=5, context=ctx)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _get_tls(node: Exporter, path: str, ctx: ssl.SSLContext) -> int:
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", node.port, timeout=5, context=ctx)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, ssl.SSLError):
        return 0
    finally:
        conn.close()


def answered_within(node: Exporter, seconds: float, **kwargs: object) -> float:
    t0 = time.monotonic()
    status, _ = scrape(node, **kwargs)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert status == 200
    assert took < seconds, f"scrape took {took:.2f} s"
    return took


def sockets(node: Exporter, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        try:
            out.append(node.connect(5))
        except OSError:
            break
    return out


def peak(node: Exporter) -> str:
    return f"RSS {node.rss_mib():.1f} MiB, peak {node.status('VmHWM') / 1024:.1f} MiB"


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


@pytest.fixture
def stop_after(request):
    """Stops the node at the end and checks SIGTERM was not delayed (< 3 s)."""
    nodes: list[Exporter] = []
    yield nodes.append
    for node in nodes:
        if node.proc.poll() is None:
            took = node.terminate(10)
            assert took < 3, f"SIGTERM took {took:.1f} s"


def test_tls_handshake_flood(tmp_path, stop_after):
    """Sockets that connect to the TLS port and never finish a handshake count against
    --max-connections: past it the oldest are dropped, so a real client gets through."""
    ca = CA("servers")
    ca.issue("gpu-exporter", server=True).write(tmp_path, "tls.crt", "tls.key")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    web = tmp_path / "web.yaml"
    web.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    node = Exporter(
        "-c", "500", "--web-config-file", str(web),
        "--max-connections", "64", "--http-timeout", "3000", log=tmp_path / "log",
    )  # fmt: skip
    stop_after(node)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    ctx.check_hostname = False
    # ready: the first cycle (and its startup log lines) is done
    wait_until(lambda: _get_tls(node, "/ready", ctx) == 200, 20, "ready over TLS")
    lines = len(node.output().splitlines())
    fds0 = node.open_files()
    stamp = FRESH.search(scrape(node, ctx)[1])
    # half a ClientHello each, then nothing
    flood = sockets(node, 300)
    for s in flood:
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    time.sleep(0.5)
    took = answered_within(node, 1.0, ctx=ctx)
    assert node.open_files() < fds0 + 64 + 20  # the cap, plus the answer in flight
    assert node.rss_mib() < RSS_MIB
    close_all(flood)
    wait_until(lambda: FRESH.search(scrape(node, ctx)[1]).group(1) != stamp.group(1), 5, "fresh")
    log = node.output()
    assert "Traceback" not in log
    assert len(log.splitlines()) - lines <= 3, log.splitlines()[lines:]
    print(f"\nTLS handshake flood: 300 sockets, cap 64, scrape {took * 1000:.0f} ms, {peak(node)}")


def test_header_flood_and_slowloris(tmp_path, stop_after):
    """Headers under the budget but never finished, headers over it (431), and headers a
    byte at a time: memory and fds stay bounded, a scrape is answered within 1 s."""
    node = Exporter(
        "-c", "500", "--max-connections", "100", "--http-timeout", "2000", log=tmp_path / "log",
    )  # fmt: skip
    stop_after(node)
    node.wait_ready()
    base = Baseline(node)
    big = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(3)
    )
    pending = sockets(node, 80)
    for s in pending:
        s.sendall(big[:15000])  # under the 16 KiB budget, never finished
    over = sockets(node, 20)
    for s in over:
        s.sendall(big + b"X-more: " + b"b" * 8000 + b"\r\n\r\n")
    answers = []
    for s in over:
        s.settimeout(3)
        try:
            answers.append(s.recv(200))
        except OSError:
            answers.append(b"")
    assert sum(a.startswith(b"HTTP/1.1 431") for a in answers) >= 15, answers[:3]
    drip = sockets(node, 30)
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        for s in drip:
            with contextlib.suppress(OSError):
                s.send(b"X")
        time.sleep(0.2)
    took = answered_within(node, 1.0)
    assert node.rss_mib() < RSS_MIB
    assert node.open_files() < base.fds + 100 + 20
    time.sleep(2.5)  # the header timeout (2 s) cuts the pending and dripping ones off
    assert node.open_files() < base.fds + 10
    close_all(pending + over + drip)
    base.check(extra_lines=3)
    print(f"\nheader flood + slowloris: scrape {took * 1000:.0f} ms, {peak(node)}")


def test_clients_that_never_read(tmp_path, stop_after):
    """Clients that pipeline requests and never read are cut off after the write timeout;
    their fds are returned and SIGTERM is not delayed by them. (The scrape limit is
    raised past the 40 clients: how they meet it is test_routes_scrape_limit.py's subject.)"""
    node = Exporter(
        "-c", "500", "--max-connections", "100", "--max-concurrent-scrapes", "100",
        "--http-write-timeout", "1500", "--http-timeout", "5000", log=tmp_path / "log",
    )  # fmt: skip
    node.wait_ready()
    base = Baseline(node)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200
    deaf = []
    for s in sockets(node, 40):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.send(request)
        deaf.append(s)
    time.sleep(0.3)
    took = answered_within(node, 1.0)
    assert node.rss_mib() < RSS_MIB
    wait_until(lambda: node.open_files() < base.fds + 10, 6, "the deaf clients cut off")
    base.check(extra_lines=3)
    # and SIGTERM with a fresh batch of them still connected
    more = sockets(node, 20)
    for s in more:
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.send(request)
    time.sleep(0.3)
    mem = peak(node)
    stopped = node.terminate(10)
    assert stopped < 3
    assert "Traceback" not in node.output()
    close_all(deaf + more)
    print(f"\nnever-reading clients: scrape {took * 1000:.0f} ms, {mem}, SIGTERM {stopped:.2f} s")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_wrong_password_flood_after_a_reload(tmp_path, stop_after):
    """Threads sending wrong passwords right after a web config reload: the real scraper,
    verified before, is answered from the cache within 1 s."""
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    node = Exporter("-c", "500", "--web-config-file", str(web), log=tmp_path / "log")
    stop_after(node)
    good = _basic("prom", "secret")
    node.wait_ready()  # /ready needs no password; the first cycle is done
    base = Baseline(node, auth=good)
    web.write_text(
        f"basic_auth_users:\n  prom: {hashed}\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    node.proc.send_signal(signal.SIGHUP)
    stop = threading.Event()
    refused = [0]

    def attacker(k: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            status = http_get(
                node.url + "/metrics", {"Authorization": _basic("prom", f"x{k}-{i}")}
            )[0]
            refused[0] += status in (401, 503)

    threads = [threading.Thread(target=attacker, args=(k,), daemon=True) for k in range(6)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        worst = max(answered_within(node, 1.0, auth=good) for _ in range(5))
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert refused[0] > 5  # the flood happened (bcrypt at cost 10 bounds its rate)
    base.check(extra_lines=3)
    print(
        f"\nwrong passwords: {refused[0]} refused, "
        f"scraper worst {worst * 1000:.0f} ms, {peak(node)}"
    )


def test_truncated_web_config_keeps_basic_auth(tmp_path, stop_after):
    """An empty or truncated web config picked up while running never turns auth off."""
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yaml"
    full = (
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        f"basic_auth_users:\n  prom: {hashed}\n"
    )
    web.write_text(full)
    node = Exporter("-c", "500", "--web-config-file", str(web), log=tmp_path / "log")
    stop_after(node)
    good = _basic("prom", "secret")
    node.wait_ready()  # /ready needs no password; the first cycle is done
    for broken in ("", full[: full.index("basic_auth_users")], full[: len(full) - 30]):
        web.write_text(broken)
        node.proc.send_signal(signal.SIGHUP)
        time.sleep(1.3)
        assert scrape(node)[0] == 401, repr(broken)
        assert scrape(node, auth=good)[0] == 200
    log = node.output()
    assert "still serving with the last good web config" in log
    assert hashed not in log and "Traceback" not in log


def test_fifo_as_metrics_file_on_reload(tmp_path, stop_after):
    """A FIFO (or /dev/zero) put where the metrics file was is refused at once on SIGHUP:
    one line, the last good file stays, SIGTERM is not delayed."""
    from exporter.config.model import default_metrics_file

    metrics = tmp_path / "metrics.csv"
    metrics.write_text(Path(default_metrics_file()).read_text())
    node = Exporter("-c", "500", "-f", str(metrics), log=tmp_path / "log")
    node.wait_ready()
    base = Baseline(node)
    metrics.unlink()
    os.mkfifo(metrics)
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "a FIFO" in node.output(), 5, "the FIFO refused")
    metrics.unlink()
    metrics.symlink_to("/dev/zero")
    time.sleep(1.1)
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "a character device" in node.output(), 5, "/dev/zero refused")
    answered_within(node, 1.0)
    base.check(extra_lines=2)
    assert node.terminate(10) < 3


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sighup_storm(tmp_path, stop_after):
    """500 SIGHUPs in about 2 s: reloads are coalesced (about one a second), the log
    grows by a few lines, scrapes are answered throughout."""
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    node = Exporter("-c", "500", "--web-config-file", str(web), log=tmp_path / "log")
    stop_after(node)
    good = _basic("prom", "secret")
    node.wait_ready()  # /ready needs no password; the first cycle is done
    lines = len(node.output().splitlines())
    cpu0, t0 = _cpu_s(node.proc.pid), time.monotonic()
    for i in range(500):
        node.proc.send_signal(signal.SIGHUP)
        if i % 100 == 0:
            answered_within(node, 1.0, auth=good)
        time.sleep(0.004)
    time.sleep(1.2)
    cpu, wall = _cpu_s(node.proc.pid) - cpu0, time.monotonic() - t0
    grown = node.output().splitlines()[lines:]
    assert len(grown) <= 6, grown  # "metrics file unchanged", about once a second
    assert node.rss_mib() < RSS_MIB
    print(
        f"\nSIGHUP storm: 500 signals in {wall:.1f} s cost {cpu:.2f} s CPU, {len(grown)} log lines"
    )


def test_half_closed_requests_get_an_answer_or_a_clean_close(tmp_path, stop_after):
    """A client that sends its request and shuts down its sending side gets the whole
    response; one that half-closes in the middle of its headers gets a clean close."""
    node = Exporter("-c", "500", log=tmp_path / "log")
    stop_after(node)
    node.wait_ready()
    base = Baseline(node)
    for _ in range(20):
        with node.connect(5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200") and b"DCGM_FI_DEV_GPU_TEMP" in data
        with node.connect(5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHo")
            s.shutdown(socket.SHUT_WR)
            assert s.recv(100) == b""
    base.check(extra_lines=1)
