"""Whole connections against the exporter process: request bodies followed through,
pipelined requests, and a client that never reads its answers.

The header budget (docs/security.md) must hold for every request of a connection, after
a chunked or Content-Length body too; a client that pipelines scrapes and never reads
must cost bounded memory and be cut off at the write timeout. Memory is the exporter's
own RSS from /proc; the bound is the one docs/security.md gives: 32 MiB of growth.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time

import bcrypt
import pytest

from tests.http.test_headers import FRAMED, HEAD
from tests.procs import Exporter, wait_until
from tests.reliability.test_http_attacks import Baseline, answered_within

GROWTH_MIB = 32
CONNECTIONS = 100
CHUNKED = (
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n4\r\nabcd\r\n0\r\n\r\n"
)
# 1 MiB of request head that never ends, each field within aiohttp's own limits (8190
# bytes, 128 fields): only the header budget stands in its way.
UNFINISHED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
    b"X-%d: %s\r\n" % (i, b"a" * 8150) for i in range(127)
)
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def _send_all(s: socket.socket, data: bytes, seconds: float = 5.0) -> int:
    """Send ``data`` without blocking, for at most ``seconds``; the bytes that went."""
    s.setblocking(False)
    sent, end = 0, time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < end:
        try:
            sent += s.send(data[sent : sent + 65536])
        except BlockingIOError:
            time.sleep(0.005)
        except OSError:  # answered 431 and reset
            break
    return sent


def _statuses(s: socket.socket, seconds: float = 3.0) -> list[int]:
    """Status codes of what the server answered until it closed (or ``seconds``)."""
    s.setblocking(True)
    s.settimeout(seconds)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    return [int(m) for m in STATUS.findall(data)]


@pytest.fixture
def stopped():
    nodes: list[Exporter] = []
    yield nodes.append
    for node in nodes:
        if node.proc.poll() is None:
            assert node.terminate(10) < 3


@pytest.mark.parametrize("auth", [False, True], ids=["no auth", "basic auth"])
def test_a_chunked_request_does_not_lift_the_header_budget(tmp_path, stopped, auth):
    """100 connections, each a complete chunked request and then an unfinished 1 MiB head:
    each gets 431 after 16 KiB and is closed; RSS grows by less than 32 MiB."""
    args = ["-c", "500", "--max-connections", "200"]
    if auth:
        web = tmp_path / "web.yaml"
        hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
        web.write_text(f"basic_auth_users:\n  prom: {hashed}\n")
        args += ["--web-config-file", str(web)]
    node = Exporter(*args, log=tmp_path / "log")
    stopped(node)
    node.wait_ready()
    rss0 = node.rss_mib()
    socks = [node.connect(5) for _ in range(CONNECTIONS)]
    for s in socks:
        s.sendall(CHUNKED)
    first = [_statuses_one(s) for s in socks[:5]]
    assert first == [401 if auth else 405] * 5  # the chunked request was answered
    sent = [_send_all(s, UNFINISHED) for s in socks]
    grown = node.rss_mib() - rss0
    answers = [_statuses(s, 2.0) for s in socks]
    for s in socks:
        s.close()
    refused = sum(431 in a for a in answers)
    print(
        f"\nchunked then 1 MiB of head x{CONNECTIONS} ({'basic auth' if auth else 'no auth'}):"
        f" RSS +{grown:.1f} MiB, {refused} answered 431, at most {max(sent)} bytes taken"
    )
    assert grown < GROWTH_MIB
    assert refused >= CONNECTIONS * 0.9, answers[:3]
    assert "Traceback" not in node.output()


def _statuses_one(s: socket.socket) -> int:
    """The status of one response (headers and a short body) on a kept-alive connection."""
    s.settimeout(3)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    m = STATUS.match(data)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    node = Exporter(
        "-c",
        "1000",
        "--http-max-header-bytes",
        "1024",
        log=tmp_path_factory.mktemp("framing") / "log",
    )  # 2000-byte bodies: counted as heads, they would get 431
    node.wait_ready()
    yield node
    assert node.terminate(10) < 3


CLOSE = HEAD.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n")


@pytest.mark.parametrize("name", FRAMED)
def test_the_budget_and_aiohttp_read_the_same_framing(plain, name):
    """Each body the budget follows, then two requests: aiohttp answers the body's request
    and both others (or refuses the body with 400 and closes): never 431."""
    with plain.connect(5) as s:
        s.sendall(FRAMED[name] + HEAD + CLOSE)
        got = _statuses(s)
    assert got in ([405, 200, 200], [400]), got


def test_a_client_pipelining_scrapes_and_never_reading(tmp_path, stopped):
    """1,000 pipelined scrapes, nothing read, then more for as long as the exporter takes
    them: RSS grows by less than 32 MiB, a scrape on another connection is answered within
    1 s, and the client is cut off at the write timeout (with one log line)."""
    node = Exporter(
        "-c", "500", "--http-write-timeout", "3000", "--http-timeout", "10000",
        log=tmp_path / "log",
    )  # fmt: skip
    stopped(node)
    node.wait_ready()
    base = Baseline(node)
    rss0 = node.rss_mib()
    deaf = socket.socket()
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.connect(("127.0.0.1", node.port))
    scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    sent = _send_all(deaf, scrape * 1000, 1.0)
    time.sleep(0.3)
    grown = node.rss_mib() - rss0
    took = answered_within(node, 1.0)
    more = sent + _send_all(deaf, scrape * 200_000, 2.5)  # until the write timeout
    grown_more = node.rss_mib() - rss0
    wait_until(lambda: "stopped reading" in node.output(), 5, "the client cut off")
    with pytest.raises(ConnectionResetError):
        deaf.setblocking(True)
        deaf.settimeout(5)
        while deaf.recv(1 << 20):
            pass
    deaf.close()
    print(
        f"\n1,000 pipelined scrapes never read: RSS +{grown:.1f} MiB, another scrape "
        f"{took * 1000:.0f} ms; {more / 1e6:.1f} MB of scrapes in 2.5 s: +{grown_more:.1f} MiB"
    )
    assert sent == len(scrape) * 1000
    assert grown < GROWTH_MIB
    assert grown_more < GROWTH_MIB
    # and more requests cost no more: while the client does not read, nothing more is read
    # from it (with reading going on, the queued requests grow about 5 MiB a second)
    assert grown_more - grown < 4
    base.check(extra_lines=2)
