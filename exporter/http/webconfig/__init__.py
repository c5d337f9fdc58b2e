"""The web config file (exporter-toolkit's format): TLS, basic auth and response headers.

The file is loaded once at startup, where a bad file stops the exporter. It is then
re-checked every few seconds and on SIGHUP; a change to it, or to a certificate or CA
file it names, takes effect for new connections without a restart. A file that no longer
loads, or that would turn basic auth or TLS off, leaves the last good configuration in
place, and the log says why in one line. Basic auth covers every path except those
excluded (by default the kubelet's probes, /health and /ready, whose bodies then say
no more than ready or not).

Modules: parse (reading, validation), tls (SSLContext), auth (bcrypt, cache), state
(the configuration in force and its reloading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from exporter.http.webconfig.auth import basic_credentials
from exporter.http.webconfig.parse import (
    HEADERS,
    HTTP_KEYS,
    TLS_KEYS,
    TOP_KEYS,
    Loaded,
    WebConfig,
    WebConfigError,
    load,
    parse,
)
from exporter.http.webconfig.state import POLL_S, WebState
from exporter.runtime import signals

log = logging.getLogger(__name__)

__all__ = [
    "HEADERS",
    "HTTP_KEYS",
    "POLL_S",
    "PROBES",
    "TLS_KEYS",
    "TOP_KEYS",
    "WEB",
    "Loaded",
    "WebConfig",
    "WebConfigError",
    "WebState",
    "authenticated",
    "basic_credentials",
    "install",
    "load",
    "parse",
    "ssl_context",
]

PROBES = frozenset({"/health", "/ready"})
"""Paths served without basic auth by default: the kubelet's probes carry no credentials."""

WEB = web.AppKey("web_config", WebState)
AUTHENTICATED = "gpu_exporter_authenticated"
"""Request key: True when the request passed basic auth (or none is configured)."""


def authenticated(request: web.Request) -> bool:
    """Whether the request proved who it is (or the server asks no one)."""
    return bool(request.get(AUTHENTICATED, True))


def _guard(excluded: frozenset[str]) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        state = request.app[WEB]
        cfg = state.config
        if cfg.tls is not None and cfg.tls.allowed_sans is not None:
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            sans = {v for _, v in (peer or {}).get("subjectAltName", ())}
            if not sans & cfg.tls.allowed_sans:
                return web.Response(status=403, text="client certificate not allowed\n")
        if not cfg.users:
            return await handler(request)
        resource = request.match_info.route.resource
        ok = await state.authorized(request.headers.get("Authorization"))
        request[AUTHENTICATED] = bool(ok)
        if ok or (resource is not None and resource.canonical in excluded):
            return await handler(request)
        if ok is None:
            return web.Response(
                status=503, text="too many logins in progress\n", headers={"Retry-After": "1"}
            )
        return web.Response(
            status=401,
            text="Unauthorized\n",
            headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'},
        )

    return guard


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    state = request.app.get(WEB)
    if state is not None:
        response.headers.update(state.config.headers)


async def _watching(app: web.Application) -> AsyncIterator[None]:
    state = app[WEB]
    wake = asyncio.Event()
    unsubscribe = signals.subscribe(app, wake)

    async def check(_signalled: bool) -> bool:
        return await state.reload()  # SIGHUP checks at once; only a change reloads

    task = asyncio.create_task(
        signals.reloading(wake, check, f"web config {state.config.path}", POLL_S),
        name="web-config",
    )
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if unsubscribe is not None:
        unsubscribe()
    state.close()


def install(app: web.Application, path: str, excluded: frozenset[str] = PROBES) -> WebState:
    """Load ``path`` and wire it into the app: basic auth (except on ``excluded`` paths),
    headers, reloading. Raises WebConfigError when the file cannot be used. Pass
    :func:`ssl_context` to the server to serve TLS."""
    status = app.get(signals.RELOADS)
    state = WebState(load(path), status)
    app[WEB] = state
    app.middlewares.append(_guard(excluded))
    app.on_response_prepare.append(_add_headers)
    app.cleanup_ctx.append(_watching)
    log.info("web config %s: %s", path, state.config.describe())
    return state


def ssl_context(app: web.Application) -> ssl.SSLContext | None:
    """The TLS context to listen with, or None for plain HTTP."""
    state = app.get(WEB)
    return state.context if state is not None else None
