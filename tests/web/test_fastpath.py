"""Scrapes answered in the connection guard (exporter/fastpath.py) look exactly like
aiohttp's answers, keep the connection alive, and leave every other request to aiohttp."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator

import pytest

from exporter.fastpath import MAX_KNOWN, FastMetrics
from tests.procs import Exporter

IDLE_MS = 1500


def _response(s: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response read from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += s.recv(65536)
    return head, body


def _names(head: bytes) -> list[bytes]:
    return sorted(line.split(b":")[0].lower() for line in head.split(b"\r\n")[1:])


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Exporter]:
    log = tmp_path_factory.mktemp("fast") / "exporter.log"
    n = Exporter("-c", "1000", "--http-timeout", str(IDLE_MS), log=log)
    n.wait_ready()
    yield n
    assert "Traceback" not in n.stop()


def test_same_answer_as_aiohttp_and_kept_alive(node):
    fast = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
    # a Connection header sends the same scrape through aiohttp's pipeline
    slow = fast[:-2] + b"Connection: keep-alive\r\n\r\n"
    with node.connect() as s:
        heads = []
        for request in (fast, slow, fast, fast):  # one connection throughout
            s.sendall(request)
            head, body = _response(s)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"DCGM_FI_DEV_GPU_TEMP" in gzip.decompress(body)
            heads.append(head)
        assert _names(heads[0]) == _names(heads[1])  # the same headers, aiohttp's included
        assert b"Content-Encoding: gzip" in heads[0]
        assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in heads[0]
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # no gzip asked: plain
        head, body = _response(s)
        assert b"Content-Encoding" not in head and body.startswith(b"# HELP")


def test_idle_timeout_still_closes_the_connection(node):
    with node.connect(timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        _response(s)
        t0 = time.monotonic()
        assert s.recv(1) == b""  # the server closes an idle connection
        assert 0.5 * IDLE_MS / 1e3 < time.monotonic() - t0 < 4 * IDLE_MS / 1e3


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",  # obs-fold: aiohttp's 400
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
        b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",
        b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.0\r\n\r\n",
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
    ],
)
def test_anything_else_is_left_to_aiohttp(request_bytes):
    fast = FastMetrics(lambda: (b"plain", b"gzip"))
    assert fast(request_bytes) is None
    assert fast.served == 0


def test_accept_encoding_decides_the_body():
    fast = FastMetrics(lambda: (b"plain", b"gzip"))
    assert fast(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip;q=0\r\n\r\n").endswith(b"plain")
    assert fast(b"GET /metrics HTTP/1.1\r\naccept-encoding: x-gzip\r\n\r\n").endswith(b"gzip")
    assert fast(b"GET /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\nplain")


def test_requests_are_remembered_within_a_bound():
    fast = FastMetrics(lambda: (b"plain", b"gzip"))
    scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
    assert fast.known(scrape) is None
    assert fast(scrape).endswith(b"gzip")
    assert fast.known(scrape) is True  # the next identical request skips the parser
    assert fast.known(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") is None
    for i in range(3 * MAX_KNOWN):  # a client varying its requests cannot grow the memory
        assert fast(b"GET /metrics HTTP/1.1\r\nHost: h%d\r\n\r\n" % i).endswith(b"plain")
        assert len(fast._known) <= MAX_KNOWN
    assert fast.served == 1 + 3 * MAX_KNOWN


def test_a_remembered_request_split_or_pipelined_goes_the_long_way(node):
    scrape = b"GET /metrics HTTP/1.1\r\nHost: y\r\n\r\n"
    with node.connect() as s:
        s.sendall(scrape)
        assert _response(s)[1].startswith(b"# HELP")
        s.sendall(scrape[:10])  # the same request in two pieces
        time.sleep(0.05)
        s.sendall(scrape[10:])
        assert _response(s)[1].startswith(b"# HELP")
        s.sendall(scrape + scrape)  # two at once: both answered, in order
        stream = s.makefile("rb")
        for _ in range(2):
            assert stream.readline() == b"HTTP/1.1 200 OK\r\n"
            length = 0
            while (line := stream.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            assert stream.read(length).startswith(b"# HELP")
