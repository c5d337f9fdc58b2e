"""Builds the aiohttp application; its cleanup context owns NVML and the collection loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from exporter import webconfig
from exporter.catalog import Catalog
from exporter.collector import Collector
from exporter.config import Config
from exporter.poller import Poller
from exporter.server import POLLER, TASK, routes

log = logging.getLogger(__name__)


def build(cfg: Config, catalog: Catalog) -> web.Application:
    """The application: routes, plus a poller that starts and stops with it."""
    app = web.Application(handler_args={"max_field_size": 8190, "max_line_size": 8190})
    attribution = None
    if cfg.kube is not None:
        from exporter.kube.attribution import Attribution  # loads grpc: only with -k

        attribution = Attribution(cfg.kube)
    collector = Collector(
        catalog,
        cfg.hostname,
        cfg.hostname_label,
        slow_s=max(cfg.collect_timeout_s / 2, 0.5),
        shared_keys=attribution.shared_keys if attribution else None,
        resolve_pid=attribution.resolve_pid if attribution else None,
    )
    app[POLLER] = Poller(catalog, collector, cfg.interval_s, cfg.collect_timeout_s, attribution)
    routes(app)
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
    loop = asyncio.get_running_loop()
    close = loop.run_in_executor(None, poller.collector.close)
    try:
        await asyncio.wait_for(close, 2.0)
    except TimeoutError:
        log.warning("NVML shutdown did not finish in 2 s; exiting anyway")
    if poller.attribution is not None:
        await poller.attribution.close()
    poller.close()


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
        web.run_app(
            app,
            host=cfg.host or None,
            port=cfg.port,
            print=None,
            access_log=None,
            shutdown_timeout=3.0,
            ssl_context=webconfig.ssl_context(app),
        )
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", cfg.host or "*", cfg.port, e.strerror or e)
        return 1
    return 0
