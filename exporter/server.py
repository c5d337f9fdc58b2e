"""HTTP endpoints. /metrics only returns bytes the poller rendered; it never calls NVML."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter import __version__
from exporter.poller import Poller
from exporter.render import CONTENT_TYPE

log = logging.getLogger(__name__)


class BadRequestLog(logging.Filter):
    """Turns aiohttp's report of a request it could not parse (a 400: oversized or
    malformed headers, junk on the port) from an ERROR with a traceback, per request,
    into one warning line a minute that counts the rest: a client sending junk must
    not be able to flood the log."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last = float("-inf")
        self._quiet = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or record.levelno < logging.ERROR:
            return True  # a real failure in a handler (or debug output): keep it whole
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._quiet += 1
            return False
        record.msg = "refused a malformed HTTP request (%s)%s"
        more = f"; {self._quiet} more since the last report" if self._quiet else ""
        record.args = (str(exc).replace("\n", " ")[:200], more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        self._last, self._quiet = now, 0
        return True


HTTP_LOG = logging.getLogger("exporter.http")
"""aiohttp's per-connection logger (handler_args in app.py), with :class:`BadRequestLog`."""
HTTP_LOG.addFilter(BadRequestLog())

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


def wants_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header asks for gzip by name (``gzip;q=0`` refuses it).

    Only an explicit ``gzip`` (or ``x-gzip``) counts, not ``*``; a malformed quality
    value counts as a refusal, so junk gets the plain text, which every client reads.
    """
    for entry in accept_encoding.lower().split(","):
        coding, *params = entry.split(";")
        if coding.strip() not in ("gzip", "x-gzip"):
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        return 0 < q <= 1  # also false for nan
    return False


async def metrics(request: web.Request) -> web.Response:
    expo = request.app[POLLER].exposition
    if wants_gzip(request.headers.get("Accept-Encoding", "")):
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


class _Refused(asyncio.Protocol):
    """Closes a connection as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class ConnectionLimit:
    """Protocol factory for ``loop.create_server``: aiohttp's server, with a connection cap.

    When ``limit`` connections are open, a new one makes the oldest ones that have not
    been told to go yet shut down (aiohttp's graceful shutdown: at once if the
    connection waits for a request, as an idle keep-alive or a slow client does;
    after its response, or ``grace_s``, if it is sending one), so that a flood of idle
    connections cannot lock a scraper out. Only when every open connection is already
    going is the new one refused. aiohttp counts a connection once its transport is
    set up, which asyncio does after accepting up to ``backlog`` at a time, so open
    connections stay under ``limit`` plus the listen backlog, plus those still going.
    """

    def __init__(self, server: web.Server, limit: int, grace_s: float = 3.0) -> None:
        self.server = server
        self.limit = limit
        self.grace_s = grace_s
        self.evicted = 0
        self.refused = 0
        self._going: set[object] = set()  # told to shut down, maybe still sending
        self._tasks: set[asyncio.Task[None]] = set()
        self._logged = float("-inf")

    def __call__(self) -> asyncio.BaseProtocol:
        conns = self.server.connections  # oldest first
        if self._going:
            self._going.intersection_update(conns)  # forget the ones that are gone
        if len(conns) >= self.limit:
            staying = [c for c in conns if c not in self._going]
            excess = len(staying) - self.limit + 1
            if not staying:
                self.refused += 1
                self._warn(len(conns))
                return _Refused()
            for victim in staying[: max(excess, 1)]:
                self._going.add(victim)
                victim.close()  # wakes it if it waits for a request; shutdown() then closes it
                task = asyncio.get_running_loop().create_task(victim.shutdown(self.grace_s))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                self.evicted += 1
            self._warn(len(conns))
        return self.server()

    def _warn(self, open_now: int) -> None:
        now = time.monotonic()
        if now - self._logged >= 60:
            self._logged = now
            log.warning(
                "%d HTTP connections open, the limit is %d (--max-connections): closing the "
                "oldest (%d so far), refusing new ones when all are closing (%d so far)",
                open_now,
                self.limit,
                self.evicted,
                self.refused,
            )
