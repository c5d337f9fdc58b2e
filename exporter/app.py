"""Builds the aiohttp application; its cleanup context owns NVML and the collection loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator

from aiohttp import web

from exporter import reload, webconfig
from exporter.catalog import Catalog
from exporter.collector import Collector
from exporter.config import Config
from exporter.poller import Poller
from exporter.server import HTTP_LOG, POLLER, TASK, ConnectionLimit, routes

log = logging.getLogger(__name__)

# Request-line and header limits (aiohttp's defaults, stated here so docs/security.md can
# say what they are): a longer line or field, or more headers, gets 400 and is closed.
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 128
BACKLOG = 128  # connections the kernel queues before the exporter accepts them
SHUTDOWN_S = 3.0  # on SIGTERM: time in-flight responses get to finish
CLOSE_S = 2.0  # on SIGTERM: time NVML gets to shut down


def build(cfg: Config, catalog: Catalog) -> web.Application:
    """The application: routes, plus a poller that starts and stops with it."""
    app = web.Application(
        handler_args={
            "max_field_size": MAX_FIELD_BYTES,
            "max_line_size": MAX_LINE_BYTES,
            "max_headers": MAX_HEADERS,
            # aiohttp arms this when a connection opens and again after each response,
            # and closes a connection still waiting for a full request when it fires:
            # it is the header-read timeout (slow clients) as well as the idle timeout.
            "keepalive_timeout": cfg.http_timeout_s,
            "logger": HTTP_LOG,  # malformed requests: one line a minute, not a traceback each
        }
    )
    attribution = None
    if cfg.kube is not None:
        from exporter.kube.attribution import Attribution  # loads grpc: only with -k

        attribution = Attribution(cfg.kube)
    collector = Collector(
        catalog,
        cfg.hostname,
        "" if cfg.no_hostname else cfg.hostname_label,  # "": no node label (-n)
        slow_s=max(cfg.collect_timeout_s / 2, 0.5),
        shared_keys=attribution.shared_keys if attribution else None,
    )
    collector.enumerator.replace_blanks = cfg.replace_blanks_in_model_name
    app[POLLER] = Poller(
        catalog, collector, cfg.interval_s, cfg.collect_timeout_s, attribution, cfg
    )
    routes(app)
    reload.install(app, app[POLLER], catalog.path)
    app.cleanup_ctx.append(_collecting)
    if cfg.web_config_file:
        webconfig.install(app, cfg.web_config_file)
    return app


async def _collecting(app: web.Application) -> AsyncIterator[None]:
    poller = app[POLLER]
    task = asyncio.create_task(poller.run(), name="collect")
    app[TASK] = task
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # A daemon thread, not an executor: an NVML shutdown that hangs must not hold the exit.
    closer = threading.Thread(target=poller.collector.close, name="nvml-close", daemon=True)
    closer.start()
    await asyncio.get_running_loop().run_in_executor(None, closer.join, CLOSE_S)
    if closer.is_alive():
        log.warning("NVML shutdown did not finish in %g s; exiting anyway", CLOSE_S)
    if poller.attribution is not None:
        await poller.attribution.close()
    poller.close()


async def serve(app: web.Application, cfg: Config) -> None:
    """Serve ``app`` on the configured address until SIGTERM or SIGINT, then stop cleanly.

    aiohttp's run_app does the same, except for the connection cap (ConnectionLimit),
    which needs the protocol factory.
    """
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        assert runner.server is not None
        tls = webconfig.ssl_context(app)
        listener = await loop.create_server(
            ConnectionLimit(runner.server, cfg.max_connections),
            host=cfg.host or None,
            port=cfg.port,
            ssl=tls,
            ssl_handshake_timeout=cfg.http_timeout_s if tls else None,
            backlog=BACKLOG,
        )
        try:
            await stop.wait()
            log.info("stopping")
        finally:
            listener.close()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()


def run(cfg: Config, catalog: Catalog) -> int:
    """Serve until SIGINT/SIGTERM."""
    app = build(cfg, catalog)
    log.info(
        "serving on %s:%d, collecting every %g s",
        cfg.host or "*",
        cfg.port,
        cfg.interval_s,
    )
    try:
        asyncio.run(serve(app, cfg))
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", cfg.host or "*", cfg.port, e.strerror or e)
        return 1
    poller = app[POLLER]
    if poller.busy:
        # The worker thread is inside an NVML call that does not return; Python would wait
        # for it at exit, past the pod's grace period. Nothing is left to save.
        log.warning(
            "exiting while an NVML call is still running (%s)",
            poller.collector.busy_with or "NVML",
        )
        logging.shutdown()
        os._exit(0)
    return 0
