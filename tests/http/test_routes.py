"""The HTTP layer in-process, through its Source interface, with a real aiohttp client:
what /metrics, /health and /ready answer, and what /ready shows to whom."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from exporter.http.routes import CONTENT_TYPE, Source, routes, scrub

PLAIN = b"# TYPE x gauge\nx 1\n"


class Node:
    """The state a Source reads: plain data the test sets."""

    def __init__(self) -> None:
        self.ready = (True, [])
        self.alive = True
        self.authenticated = True


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient, Node]]:
    node = Node()
    app = web.Application()
    routes(
        app,
        Source(
            exposition=lambda: (PLAIN, gzip.compress(PLAIN)),
            readiness=lambda: node.ready,
            alive=lambda: node.alive,
            authenticated=lambda _request: node.authenticated,
        ),
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, node
    await client.close()


async def test_metrics_plain_and_gzip(served):
    client, _ = served
    r = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert r.headers["Content-Type"] == CONTENT_TYPE and await r.read() == PLAIN
    r = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert r.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(await r.read()) == PLAIN


async def test_health_follows_the_collection_loop(served):
    client, node = served
    assert (await client.get("/health")).status == 200
    node.alive = False
    r = await client.get("/health")
    assert r.status == 500 and "collection loop stopped" in await r.text()


async def test_ready_gives_one_reason_without_paths(served):
    client, node = served
    node.ready = (
        False,
        [
            "metrics file /etc/secret/metrics.csv: cannot read it",
            "metrics file /etc/secret/metrics.csv: cannot read it",  # repeated
            "GPU 1 (GPU-1234) is lost",
        ],
    )
    r = await client.get("/ready")
    text = await r.text()
    assert r.status == 503
    lines = text.splitlines()
    assert lines[0] == "not ready: metrics file .../metrics.csv: cannot read it"
    assert lines[1:] == ["- GPU 1 (GPU-1234) is lost"]  # the reason is not repeated
    assert "/etc" not in text


async def test_ready_tells_nothing_to_a_client_without_credentials(served):
    client, node = served
    node.authenticated = False
    node.ready = (False, ["GPU 1 (GPU-1234) is lost"])
    r = await client.get("/ready")
    assert r.status == 503 and await r.text() == "not ready\n"
    node.ready = (True, ["GPU 2 (GPU-5678) set aside"])
    r = await client.get("/ready")
    assert r.status == 200 and await r.text() == "ready\n"


def test_scrub_bounds_and_replaces_paths():
    assert scrub("socket /var/lib/kubelet/x.sock does not exist") == (
        "socket .../x.sock does not exist"
    )
    assert "<path>" not in scrub("file /etc/a/ and /")
    assert scrub("a\nsecond line") == "a"
    assert len(scrub("x" * 5000)) == 200
    assert scrub("last good collection is 5 s old (> 3 intervals)").endswith("intervals)")
