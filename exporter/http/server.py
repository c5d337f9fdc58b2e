"""Serving the application on its sockets until SIGTERM or SIGINT: the aiohttp handler's
limits, the connection guard in front of it (exporter.http.connections), the listener,
and the stop within the pod's grace period."""

from __future__ import annotations

import asyncio
import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from exporter.config.model import Config
from exporter.http import listener
from exporter.http.accesslog import HTTP_LOG
from exporter.http.connections import ConnectionLimit, Limits
from exporter.runtime import signals

log = logging.getLogger(__name__)

# Request-line and header limits (aiohttp's defaults, stated here so docs/security.md can
# say what they are): a longer line or field, or more headers, gets 400 and is closed.
# The total size of a request's headers is bounded by --http-max-header-bytes (431).
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 128
SHUTDOWN_S = 1.2  # on SIGTERM: time in-flight responses get to finish
STOP_DEADLINE_S = 1.8  # on SIGTERM: the process ends by then, whatever is still closing


def handler_args(cfg: Config) -> dict[str, Any]:
    """aiohttp's per-connection request handler settings."""
    return {
        "max_field_size": MAX_FIELD_BYTES,
        "max_line_size": MAX_LINE_BYTES,
        "max_headers": MAX_HEADERS,
        # aiohttp arms this when a connection opens and again after each response,
        # and closes a connection still waiting for a full request when it fires:
        # it is the header-read timeout (slow clients) as well as the idle timeout.
        "keepalive_timeout": cfg.http_timeout_s,
        "logger": HTTP_LOG,  # malformed requests: one line a minute, not a traceback each
    }


def limits(cfg: Config) -> Limits:
    """The HTTP connection bounds from the configuration."""
    return Limits(
        max_connections=cfg.max_connections,
        handshake_s=cfg.http_timeout_s,
        write_s=cfg.http_write_timeout_s,
        max_header_bytes=cfg.http_max_header_bytes,
    )


class _Unjoined(ThreadPoolExecutor):
    """The event loop's default executor (file reads, client closes): at the stop its
    shutdown does not wait for a call still running, so no worker thread blocked in a
    read, a request or an import holds the exit (asyncio.run waits for the default
    executor's threads; os._exit ends them)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


class BindError(Exception):
    """The address cannot be listened on; the message says which and what to do."""


async def serve(app: web.Application, cfg: Config) -> None:
    """Serve ``app`` on the configured address until SIGTERM or SIGINT, then stop cleanly.

    aiohttp's run_app does the same, except for the per-connection guard
    (exporter.http.connections), which needs the protocol factory.
    """
    asyncio.get_running_loop().set_default_executor(_Unjoined(thread_name_prefix="loop"))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    stop = asyncio.Event()
    remove = signals.on_stop(stop.set)
    try:
        assert runner.server is not None
        tls = None
        if cfg.web_config_file:
            from exporter.http import webconfig

            tls = webconfig.ssl_context(app)
        pool = ConnectionLimit(runner.server, limits(cfg), tls, listener.ACCEPT_HEADROOM)
        accepting = _listen(pool, cfg)
        log.info("serving on %s, collecting every %g s", _address(cfg), cfg.interval_s)
        try:
            await stop.wait()
            log.info("stopping")
            signals.exit_after(STOP_DEADLINE_S)
        finally:
            accepting.close()
            pool.close_all()
    finally:
        remove()
        await runner.cleanup()


def _listen(pool: ConnectionLimit, cfg: Config) -> listener.Listener:
    listener.raise_fd_limit(cfg.max_connections)
    try:
        if cfg.systemd_fds:
            socks = listener.inherited(cfg.systemd_fds)
        else:
            socks = listener.bind(cfg.host or None, cfg.port)
    except socket.gaierror as e:
        raise BindError(
            f"-a/--address {_address(cfg)}: cannot resolve host {cfg.host!r} ({e.strerror}); "
            "give an IP address or a resolvable name, or leave the host out for every interface"
        ) from None
    except OSError as e:
        if cfg.systemd_fds:
            raise BindError(f"--web-systemd-socket: {e.strerror or e}; check the .socket unit "
                            "(ListenStream=)") from None  # fmt: skip
        raise BindError(
            f"-a/--address {_address(cfg)}: cannot listen there ({e.strerror or e}); "
            "choose another address or port, or stop what is using it"
        ) from None
    accepting = listener.Listener(socks, pool.admit, pool.full, pool.forget, pool.make_room)
    pool.on_room = accepting.resume
    return accepting


def _address(cfg: Config) -> str:
    if cfg.systemd_fds:
        return f"the socket(s) systemd passed (fd {', '.join(map(str, cfg.systemd_fds))})"
    host = f"[{cfg.host}]" if ":" in cfg.host else (cfg.host or "*")
    return f"{host}:{cfg.port}"
