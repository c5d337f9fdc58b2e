"""--max-concurrent-scrapes and --health-require-gpus in the HTTP layer, in-process with a
real aiohttp server and real sockets: 503 past the limit (connection closed), a client
that stopped reading gives its slot up, /health 503 while no GPU is collected."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from exporter.http import routes as routes_module
from exporter.http.routes import SCRAPES, Source, routes

STALL_S = 3.0  # routes.STALL_S in these tests: a loaded machine takes more than 0.1 s a request
BIG = b"x" * (32 << 20)  # more than the kernel buffers of one loopback connection hold
PLAIN = {"Accept-Encoding": "identity"}


class Node:
    def __init__(self) -> None:
        self.gpus = False


@pytest.fixture
async def served(request, monkeypatch) -> AsyncIterator[tuple[TestClient, Node]]:
    monkeypatch.setattr(routes_module, "STALL_S", STALL_S)
    node = Node()
    limit, require = request.param
    app = web.Application()
    routes(
        app,
        Source(
            exposition=lambda: (BIG, BIG),
            readiness=lambda: (True, []),
            alive=lambda: True,
            max_scrapes=limit,
            has_gpus=(lambda: node.gpus) if require else None,
        ),
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, node
    await client.close()


async def deaf(client: TestClient, *, counted: bool = True) -> socket.socket:
    """A connection that asks for /metrics and never reads the answer; with ``counted``,
    returned once the server holds a scrape slot for it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, ("127.0.0.1", client.port))
    under_way = client.server.app[SCRAPES].under_way
    before = len(under_way)
    await loop.sock_sendall(s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    if not counted:  # nothing to wait for: no slot is kept without a limit
        await asyncio.sleep(0.05)
        return s
    for _ in range(5000):  # the server answers, and its writes stall (5 s on a loaded machine)
        await asyncio.sleep(0.001)
        if len(under_way) > before:
            return s
    s.close()
    raise AssertionError("the server never started answering the deaf client's scrape")


@pytest.mark.parametrize("served", [(1, False)], indirect=True)
async def test_past_the_limit_503_and_the_connection_closes(served):
    client, _ = served
    a = await deaf(client)
    try:
        r = await client.get("/metrics", headers=PLAIN)
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert r.headers.get("Connection", "").lower() == "close"
        assert "--max-concurrent-scrapes 1" in await r.text()
        # once its client has read nothing for STALL_S, the response gives its slot up
        await asyncio.sleep(STALL_S + 0.05)
        r = await client.get("/metrics", headers=PLAIN)
        assert r.status == 200 and len(await r.read()) == len(BIG)
    finally:
        a.close()


@pytest.mark.parametrize("served", [(2, False)], indirect=True)
async def test_within_the_limit_every_scrape_is_answered(served):
    client, _ = served
    a = await deaf(client)
    try:
        r = await client.get("/metrics", headers=PLAIN)
        assert r.status == 200 and len(await r.read()) == len(BIG)
    finally:
        a.close()


@pytest.mark.parametrize("served", [(0, False)], indirect=True)
async def test_no_limit_when_zero(served):
    client, _ = served
    socks = [await deaf(client, counted=False) for _ in range(3)]
    try:
        assert (await client.get("/metrics", headers=PLAIN)).status == 200
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("served", [(16, True)], indirect=True)
async def test_health_requires_a_collected_gpu(served):
    client, node = served
    r = await client.get("/health")
    assert r.status == 503 and await r.text() == "no GPU is being collected\n"
    node.gpus = True
    assert (await client.get("/health")).status == 200


@pytest.mark.parametrize("served", [(16, False)], indirect=True)
async def test_health_without_the_flag_ignores_gpus(served):
    client, _ = served
    assert (await client.get("/health")).status == 200
