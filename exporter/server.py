"""HTTP endpoints. /metrics only returns bytes the poller rendered; it never calls NVML."""

from __future__ import annotations

import asyncio

from aiohttp import web

from exporter import __version__
from exporter.poller import Poller
from exporter.render import CONTENT_TYPE

POLLER = web.AppKey("poller", Poller)
TASK = web.AppKey("collect_task", asyncio.Task)

LANDING = """<!doctype html>
<html><head><title>GPU exporter</title></head><body>
<h1>GPU exporter {version}</h1>
<p>NVIDIA GPU and MIG metrics over NVML, with dcgm-exporter's metric names.</p>
<ul>
<li><a href="metrics">metrics</a></li>
<li><a href="health">health</a> (liveness)</li>
<li><a href="ready">ready</a> (readiness, with reasons)</li>
</ul></body></html>
"""


async def metrics(request: web.Request) -> web.Response:
    expo = request.app[POLLER].exposition
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        resp = web.Response(body=expo.gzipped, headers={"Content-Encoding": "gzip"})
    else:
        resp = web.Response(body=expo.plain)
    resp.content_type = "text/plain"
    resp.headers["Content-Type"] = CONTENT_TYPE
    return resp


async def health(request: web.Request) -> web.Response:
    """Liveness: the process serves and its collection loop is alive."""
    task = request.app.get(TASK)
    if task is not None and task.done():
        return web.Response(status=500, text="collection loop stopped\n")
    return web.Response(text="ok\n")


async def ready(request: web.Request) -> web.Response:
    """Readiness: a recent successful collection; the body gives reasons and details."""
    ok, lines = request.app[POLLER].readiness()
    head = "ready" if ok else f"not ready: {lines.pop(0)}"
    body = "\n".join([head, *(f"- {line}" for line in lines)]) + "\n"
    return web.Response(status=200 if ok else 503, text=body)


async def landing(_request: web.Request) -> web.Response:
    return web.Response(text=LANDING.format(version=__version__), content_type="text/html")


def routes(app: web.Application) -> None:
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
