"""HTTP endpoints. A leaf: it serves bytes and answers it is given through a
:class:`Source` (the exposition rendered once per cycle, readiness, liveness) and
imports nothing from the collection side."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from multidict import CIMultiDict

from exporter import __version__

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus text format 0.0.4."""


def anyone(_request: web.Request) -> bool:
    """Every client counts as authenticated (no basic auth configured)."""
    return True


@dataclass(frozen=True, slots=True)
class Source:
    """What the routes serve. ``exposition``: (plain, gzipped) bytes of the latest cycle;
    ``readiness``: (ready, reasons, first most important); ``alive``: the collection loop runs."""

    exposition: Callable[[], tuple[bytes, bytes]]
    readiness: Callable[[], tuple[bool, list[str]]]
    alive: Callable[[], bool]
    authenticated: Callable[[web.Request], bool] = anyone
    max_scrapes: int = 0  # /metrics responses under way at once; past it 503 (0: no limit)
    has_gpus: Callable[[], bool] | None = None  # --health-require-gpus: /health needs one


SOURCE = web.AppKey("source", Source)
STALL_S = 0.1
"""A /metrics response counts against --max-concurrent-scrapes from its request until it
is written, except once it is older than this while its client reads nothing (the
connection paused): such clients are cut off by the write timeout and the connection
limit, and must not lock scrapers out. A request refused for want of a slot gets 503 and
its connection is closed, so a client pipelining requests cannot queue more."""


@dataclass
class _Scrapes:
    # connection (its protocol: one response at a time) -> when its response was admitted
    under_way: dict[object, float] = field(default_factory=dict)

    def busy(self, now: float) -> int:
        return sum(
            1
            for proto, t in self.under_way.items()
            if now - t <= STALL_S or not getattr(proto, "writing_paused", False)
        )


SCRAPES = web.AppKey("scrapes", _Scrapes)

LANDING = """<!doctype html>
<html><head><title>GPU exporter</title></head><body>
<h1>GPU exporter {version}</h1>
<p>NVIDIA GPU and MIG metrics over NVML, with dcgm-exporter's metric names.</p>
<ul>
<li><a href="metrics">metrics</a></li>
<li><a href="health">health</a> (liveness)</li>
<li><a href="ready">ready</a> (readiness, with the reason when not ready)</li>
</ul></body></html>
"""
_PATH = re.compile(r"(?<![\w.])/[^\s:;,'\"()]+")
MAX_REASON = 200
MAX_DETAILS = 20


_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")  # RFC 9110 §12.4.2


def wants_gzip(accept_encoding: str) -> bool:
    """Whether to gzip, by RFC 9110 §12.5.3: gzip is acceptable when the header names it
    (``gzip`` or ``x-gzip``) with a weight above 0, or names ``*`` so (and not gzip);
    identity when the header neither names it with weight 0 nor gives ``*`` weight 0.
    Gzip is chosen when acceptable and weighed at least as much as identity (identity
    not named: the least preferred acceptable coding). A weight that is not a qvalue
    (0 to 1, at most three decimals) refuses its coding; where a coding is named twice
    the first counts. No header or an empty one: plain text.
    """
    weights = _weights(accept_encoding)
    star = weights.get("*")
    gz = weights.get("gzip", star)
    identity = weights.get("identity", star)
    if not gz:  # not named (None) or refused (0)
        return False
    return identity is None or identity == 0 or gz >= identity


def _weights(accept_encoding: str) -> dict[str, float]:
    """Coding (lower case, x-gzip as gzip) -> its weight, for each coding the header names."""
    out: dict[str, float] = {}
    for element in accept_encoding.lower().split(","):
        coding, *params = element.split(";")
        coding = coding.strip()
        coding = "gzip" if coding == "x-gzip" else coding
        if not coding or coding in out:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                q = float(value.strip()) if _QVALUE.fullmatch(value.strip()) else 0.0
        out[coding] = q
    return out


def scrub(reason: str) -> str:
    """One line, bounded, each file-system path cut to its last part (``.../kubelet.sock``):
    the file is named, its directories are not (the log has the whole path)."""
    line = _PATH.sub(_last_part, reason.splitlines()[0] if reason else "")
    return line[:MAX_REASON]


def _last_part(m: re.Match[str]) -> str:
    return ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=64)
def _gzip_for(accept_encoding: str) -> bool:
    """wants_gzip, remembered: scrapers send the same header every time."""
    return wants_gzip(accept_encoding)


_GZIP_HEADERS = CIMultiDict({"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"})
_PLAIN_HEADERS = CIMultiDict({"Content-Type": CONTENT_TYPE})


async def metrics(request: web.Request) -> web.Response:
    """The latest cycle's exposition, bytes built by the poller (gzipped when asked)."""
    source = request.app[SOURCE]
    plain, gzipped = source.exposition()
    accept = request.headers.get("Accept-Encoding", "")
    if _gzip_for(accept) if len(accept) <= 256 else wants_gzip(accept):
        resp = web.Response(body=gzipped, headers=_GZIP_HEADERS)  # headers are copied
    else:
        resp = web.Response(body=plain, headers=_PLAIN_HEADERS)
    if source.max_scrapes:
        return await _limited(request, resp, source.max_scrapes)
    return resp


async def _limited(request: web.Request, resp: web.Response, limit: int) -> web.Response:
    """``resp``, written here while it holds one of ``limit`` slots; 503 when none is free."""
    scrapes = request.app[SCRAPES]
    now = time.monotonic()
    if scrapes.busy(now) >= limit:
        busy = web.Response(
            status=503,
            text=f"too many scrapes at once (--max-concurrent-scrapes {limit}); retry\n",
            headers={"Retry-After": "1"},
        )
        busy.force_close()  # a client pipelining requests does not get to queue more
        return busy
    conn = request.protocol
    scrapes.under_way[conn] = now
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:  # the client went away; nothing is left to answer
        pass
    finally:
        scrapes.under_way.pop(conn, None)
    return resp


async def health(request: web.Request) -> web.Response:
    """Liveness: the process serves and its collection loop is alive (and, with
    --health-require-gpus, collects at least one GPU)."""
    source = request.app[SOURCE]
    if not source.alive():
        return web.Response(status=500, text="collection loop stopped\n")
    if source.has_gpus is not None and not source.has_gpus():
        return web.Response(status=503, text="no GPU is being collected\n")
    return web.Response(text="ok\n")


async def ready(request: web.Request) -> web.Response:
    """Readiness: a recent successful collection. The first line is "ready" or "not ready:
    <one reason>"; further details follow, one per line. Reasons and details carry no
    file-system paths, and only a client that passed basic auth (or any, without auth)
    sees them: GPU UUIDs and pod names stay behind the password."""
    source = request.app[SOURCE]
    ok, reasons = source.readiness()
    lines = list(dict.fromkeys(scrub(r) for r in reasons if r))[:MAX_DETAILS]
    if not source.authenticated(request):
        lines = []
    head = "ready" if ok else "not ready" + (f": {lines.pop(0)}" if lines else "")
    body = "\n".join([head, *(f"- {line}" for line in lines)]) + "\n"
    return web.Response(status=200 if ok else 503, text=body)


async def landing(_request: web.Request) -> web.Response:
    return web.Response(text=LANDING.format(version=__version__), content_type="text/html")


def routes(app: web.Application, source: Source | None = None) -> None:
    """Add the routes; ``source`` (when given) is what they serve."""
    if source is not None:
        app[SOURCE] = source
    app[SCRAPES] = _Scrapes()
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
