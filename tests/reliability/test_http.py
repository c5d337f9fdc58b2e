"""Hostile HTTP input against the exporter process, on 127.0.0.1 only.

Slow clients, thousands of connections, oversized and malformed requests, odd
methods, path traversal, HTTP/1.0 and pipelining: every one gets a bounded answer
(or its connection closed), the exporter's memory stays bounded, and a normal
scrape is answered throughout. The limits are docs/security.md's.
"""

from __future__ import annotations

import gzip
import http.client
import re
import resource
import time
from collections.abc import Iterator

import bcrypt
import pytest

from exporter.config.model import DEFAULT_HTTP_MAX_HEADER_BYTES
from exporter.http.routes import wants_gzip
from tests.procs import Exporter, wait_until

TIMEOUT_MS = 2000


def raw(node: Exporter, data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes, read until the server closes (or ``timeout``)."""
    with node.connect(timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


def scrape_ms(node: Exporter) -> float:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200 and b"DCGM_FI_DEV_GPU_TEMP" in body
    return (time.perf_counter() - t0) * 1000


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Exporter]:
    log = tmp_path_factory.mktemp("http") / "exporter.log"
    n = Exporter(
        "-c", "1000", "--http-timeout", str(TIMEOUT_MS), "--max-connections", "100", log=log
    )
    n.wait_ready()
    n.rss_at_start = n.rss_mib()
    yield n
    rss, peak = n.rss_mib(), n.status("VmHWM") / 1024
    output = n.stop()
    assert "Traceback" not in output, output[-3000:]
    # dozens of malformed requests, one log line: the rest are counted into the next one
    assert output.count("refused a malformed HTTP request") == 1, output[-3000:]
    print(
        f"\nexporter RSS {n.rss_at_start:.1f} MiB before the hostile input, {rss:.1f} after, "
        f"peak {peak:.1f}"
    )


def test_slow_clients_are_cut_off(node):
    """Connections that send nothing, or headers a byte at a time, are closed once the
    HTTP timeout has passed since they connected; scrapes are not slowed meanwhile."""
    silent = [node.connect() for _ in range(30)]
    dripping = [node.connect() for _ in range(30)]
    for s in dripping:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    worst = 0.0
    open_ = set(range(len(dripping)))
    while open_ and time.monotonic() - t0 < TIMEOUT_MS / 1000 + 3:
        for i in list(open_):
            try:
                dripping[i].sendall(b"X")  # one more header byte
            except OSError:
                open_.discard(i)
        worst = max(worst, scrape_ms(node))
        time.sleep(0.2)
    took = time.monotonic() - t0
    assert not open_, f"{len(open_)} dripping clients still connected after {took:.1f} s"
    for s in silent:
        s.settimeout(3)
        assert s.recv(1) == b""  # closed by the exporter, nothing sent
        s.close()
    for s in dripping:
        s.close()
    assert took < TIMEOUT_MS / 1000 + 1.5
    assert worst < 200, worst
    print(
        f"\nslow clients: all 60 closed {took:.1f} s after connecting; worst scrape {worst:.0f} ms"
    )


def test_more_connections_than_the_limit(node):
    """2,000 connections against a limit of 100: the oldest idle ones are closed to make
    room, a scrape still gets through, memory and open files stay bounded."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 2200: raise it (ulimit -Hn) to run this")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    rss0, fds0 = node.rss_mib(), node.open_files()
    socks = []
    try:
        for i in range(2000):
            s = node.connect()
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request
            socks.append(s)
        wait_until(
            lambda: node.open_files() <= fds0 + 100 + 5, 10, "connections over the limit closed"
        )
        ms = scrape_ms(node)
        rss, fds = node.rss_mib(), node.open_files()
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert closed >= 2000 - 100 - 5
    assert fds <= fds0 + 100 + 5
    assert rss - rss0 < 16, (rss0, rss)
    assert ms < 500
    assert node.get("/ready")[0] == 200
    print(
        f"\n2,000 connections, limit 100: {closed} closed by the exporter, open files "
        f"{fds0} -> {fds}, RSS {rss0:.1f} -> {rss:.1f} MiB, scrape meanwhile {ms:.0f} ms"
    )


OVERSIZED = {
    "request line of 20 KiB": b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header of 100 KiB": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
    "200 headers": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    + b"\r\n",
    "1 MiB of headers": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + b"X-A: "
    + b"a" * 8000
    + b"\r\n" * 0
    + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 8000) for i in range(130))
    + b"\r\n",
    "header name of 10 KiB": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + b"X" * 10000
    + b": 1\r\n\r\n",
    "chunked junk": b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "TLS to the HTTP port": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100,
    "not HTTP": b"\x00\xff" * 100 + b"\r\n\r\n",
}


def _expected(request_bytes: bytes) -> int:
    """431 when the head (request line and headers) is over the header budget, as Go's
    servers answer; 400 for the rest (aiohttp's parser)."""
    end = request_bytes.find(b"\r\n\r\n")
    head = end + 4 if end >= 0 else len(request_bytes)
    return 431 if head > DEFAULT_HTTP_MAX_HEADER_BYTES else 400


@pytest.mark.parametrize("request_bytes", OVERSIZED.values(), ids=OVERSIZED.keys())
def test_oversized_or_malformed_requests_get_400_or_431(node, request_bytes):
    response = raw(node, request_bytes)
    assert status_of(response) == _expected(request_bytes), response[:200]
    assert len(response) < 1024
    assert scrape_ms(node) < 500


MALFORMED_ACCEPT = [
    {"Accept": "application/openmetrics-text; version=1.0.0"},
    {"Accept": ";;;,,,=q=q"},
    {"Accept": "*/*;q=abc, text/plain;q=1e400"},
    {"Accept-Encoding": "gzip;q=0"},
    {"Accept-Encoding": "gzip;q=abc"},
    {"Accept-Encoding": "gzip;q=0.5, identity;q=1"},
    {"Accept-Encoding": ",,,;;;gzip"},
    {"Accept-Encoding": "br, zstd, *"},
    {"Accept-Encoding": "gzip" * 1000},
    {"Accept-Encoding": "x-gzip"},
]


@pytest.mark.parametrize("headers", MALFORMED_ACCEPT, ids=lambda h: repr(h)[:40])
def test_malformed_accept_headers_get_a_whole_exposition(node, headers):
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200
    gzipped = resp.getheader("Content-Encoding") == "gzip"
    assert gzipped == wants_gzip(headers.get("Accept-Encoding", ""))
    text = (gzip.decompress(body) if gzipped else body).decode()
    assert text.startswith("# HELP DCGM_") and "process_start_time_seconds" in text
    assert resp.getheader("Content-Type").startswith("text/plain; version=0.0.4")


METHODS = {
    b"POST /metrics": 405,
    b"PUT /metrics": 405,
    b"DELETE /metrics": 405,
    b"PATCH /ready": 405,
    b"TRACE /": 405,
    b"OPTIONS *": 404,
    b"CONNECT 127.0.0.1:22": 404,
    b"FOO /metrics": 400,
    b"GET /nope": 404,
    b"GET /metrics/": 404,
    b"GET /METRICS": 404,
    b"GET /admin": 404,
}


@pytest.mark.parametrize(("line", "status"), METHODS.items(), ids=lambda v: str(v))
def test_unknown_methods_and_paths(node, line, status):
    response = raw(node, line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(response) == status, response[:200]


TRAVERSAL = [
    b"/../../etc/passwd",
    b"/%2e%2e/%2e%2e/etc/passwd",
    b"/metrics/../../../etc/passwd",
    b"/metrics/..%2f..%2f..%2fetc%2fpasswd",
    b"//etc/passwd",
    b"/..\\..\\etc\\passwd",
    b"/metrics%00.html",
    b"/proc/self/environ",
    b"/%252e%252e/etc/passwd",
    b"http://127.0.0.1/../../etc/passwd",
]


@pytest.mark.parametrize("path", TRAVERSAL, ids=lambda p: p.decode())
def test_path_traversal_finds_nothing(node, path):
    """No route serves files: every such path is a 404 (or 400), never a file's bytes."""
    response = raw(node, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(response) in (400, 404), response[:200]
    assert b"root:" not in response and b"PATH=" not in response


def test_head_http10_and_pipelining(node):
    head = raw(node, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")  # headers only
    old = raw(node, b"GET /metrics HTTP/1.0\r\n\r\n")  # closed after the response
    assert old.startswith(b"HTTP/1.0 200")
    header, _, body = old.partition(b"\r\n\r\n")
    assert int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    pipelined = raw(
        node,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    statuses = [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", pipelined)]
    assert statuses == [200, 200, 200, 404]
    assert (
        pipelined.index(b"\r\n\r\nok\n")
        < pipelined.index(b"ready\n")
        < pipelined.index(b"DCGM_FI_DEV_GPU_TEMP")
    )


HOSTS = {
    "no Host in HTTP/1.1": (b"GET /metrics HTTP/1.1\r\n\r\n", 400),
    "two Host headers": (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    "one Host, twice the same": (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
    "HTTP/1.0 without Host": (b"GET /health HTTP/1.0\r\n\r\n", 200),
}


@pytest.mark.parametrize(("head", "status"), HOSTS.values(), ids=HOSTS.keys())
def test_host_header_as_rfc_9112_asks(node, head, status):
    """RFC 9112 3.2: a server answers 400 to an HTTP/1.1 request without a Host header or
    with more than one; HTTP/1.0 requests need none. Each comes alone in one read, as a
    scrape does."""
    response = raw(node, head, timeout=2)
    assert [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", response)] == [status]


def test_a_request_body_nobody_reads_is_bounded(node):
    """A GET announcing 100 MB of body: answered, and the body is read (and dropped) for
    at most aiohttp's lingering time, never stored."""
    t0 = time.monotonic()
    response = raw(
        node,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n" + b"a" * 65536,
        timeout=15,
    )
    assert status_of(response) == 200
    assert time.monotonic() - t0 < 12


def test_memory_after_all_of_it(node):
    """Run last in this module: the hostile input above left memory where it was."""
    assert node.get("/ready")[0] == 200
    assert node.rss_mib() - node.rss_at_start < 20


def test_junk_basic_auth_is_401_not_500(tmp_path):
    """An Authorization header with bytes base64 cannot hold made the middleware fail
    (500 and a traceback per request) until the fuzz tests found it."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    n = Exporter("-c", "1000", "--web-config-file", str(web), log=tmp_path / "log")
    n.wait_ready()
    try:
        for junk in (b"Basic \x80\xff", b"Basic \xc3\xa9t\xc3\xa9", b"Basic ====", b"Basic"):
            response = raw(
                n,
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + junk + b"\r\n"
                b"Connection: close\r\n\r\n",
            )
            assert status_of(response) == 401, (junk, response[:200])
    finally:
        log = n.stop()
    assert "Traceback" not in log and "Error handling request" not in log
