"""Builds the aiohttp application; its cleanup context owns NVML and the collection loop.

This is where the collection side (poller) meets the HTTP layer (server, connections,
webconfig), which knows it only through :class:`exporter.http.routes.Source`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

from aiohttp import web

from exporter.catalog.groups import GroupError, resolve
from exporter.catalog.metricsfile import Catalog, CatalogError, load
from exporter.collector import Collector
from exporter.config import validate
from exporter.config.files import ConfigFileError, read_config_file
from exporter.config.model import DEFAULT_KERNEL_LOG, Collection, Config
from exporter.http import eviction, server
from exporter.http.routes import Source, anyone, routes
from exporter.poller import Poller
from exporter.runtime import signals

log = logging.getLogger(__name__)

CLOSE_S = 0.4  # on SIGTERM: time NVML and the kube clients get to close, side by side
CYCLE_GRACE_S = 0.1  # on SIGTERM: of CLOSE_S, time a collection cycle under way gets
XID_GRACE_S = 0.2  # on SIGTERM: of CLOSE_S, time the XID thread gets to leave its wait
METRICS_FILE_MAX_BYTES = 1 << 20
SWITCH_INTERVAL_S = 0.0005  # GIL hand-over interval (sys.setswitchinterval), set once at start

POLLER = web.AppKey("poller", Poller)
TASK = web.AppKey("collect_task", asyncio.Task)


def build(cfg: Config, catalog: Catalog) -> web.Application:
    """The application: routes, plus a poller that starts and stops with it."""
    app = web.Application(handler_args=server.handler_args(cfg))
    attribution = None
    if cfg.kube is not None:
        from exporter.workloads.attribution import Attribution  # loads hpack: only with -k

        attribution = Attribution(cfg.kube)
    collector = Collector(
        catalog,
        cfg.hostname,
        "" if cfg.no_hostname else cfg.hostname_label,  # "": no node label (-n)
        slow_s=max(cfg.collect_timeout_s / 2, 0.5),
        wants_processes=attribution.wants_processes if attribution else None,
        groups=resolve(catalog, cfg.collections),  # validated before the start
        kernel_log=DEFAULT_KERNEL_LOG if cfg.kernel_log is None else cfg.kernel_log or None,
    )
    collector.enumerator.replace_blanks = cfg.replace_blanks_in_model_name
    collector.enumerator.ci_label = cfg.release.ci_label  # GPU_CI_ID on MIG series (4.8.4+)
    poller = Poller(catalog, collector, cfg.interval_s, cfg.collect_timeout_s, attribution, cfg)
    poller.on_fatal = lambda: signals.request_stop(poller.exit_status)
    app[POLLER] = poller
    signals.install(app)
    status = app[signals.RELOADS]
    poller.selfmetrics.reloads = lambda: [
        (kind, r.ok, r.last_success_unix) for kind, r in status.items()
    ]
    routes(app, _source(app, poller, cfg))
    app.on_response_prepare.append(eviction.note_response)  # answered: evicted last
    if cfg.metrics_text is None:  # the config file's metrics.fields are read once
        signals.watch(
            app,
            signals.FileReload(
                "metrics_file", catalog.path, _read_metrics,
                partial(_load_metrics, old_names=catalog.old_names,
                        dcgm47=catalog.dcgm47, collections=cfg.collections),
                poller.reload, app[signals.RELOADS],
                "still collecting with the last good metrics file",
            ),
        )  # fmt: skip
    app.cleanup_ctx.append(_collecting)
    if cfg.web_config_file:  # TLS and bcrypt are loaded only with a web config
        from exporter.http import webconfig

        excluded = cfg.auth_excluded_paths
        webconfig.install(app, cfg.web_config_file, frozenset(excluded))
    return app


def _source(app: web.Application, poller: Poller, cfg: Config) -> Source:
    def exposition() -> tuple[bytes, bytes]:
        expo = poller.exposition
        return expo.plain, expo.gzipped

    def alive() -> bool:
        task = app.get(TASK)
        return task is None or not task.done()

    def has_gpus() -> bool:
        snap = poller.snapshot
        return snap is not None and bool(snap.gpus)

    authenticated: Callable[[web.Request], bool] = anyone
    if cfg.web_config_file:
        from exporter.http import webconfig

        authenticated = webconfig.authenticated
    return Source(
        exposition,
        poller.readiness,
        alive,
        authenticated,
        cfg.max_concurrent_scrapes,
        has_gpus if cfg.health_require_gpus else None,
    )


def _read_metrics(path: str) -> str:
    try:
        return read_config_file(path, "metrics file", METRICS_FILE_MAX_BYTES)
    except ConfigFileError as e:
        raise ValueError(str(e)) from None


def _load_metrics(
    path: str,
    old_names: bool = False,
    dcgm47: bool = False,
    collections: tuple[Collection, ...] = (),
) -> Catalog:
    try:
        catalog = load(path, old_names, dcgm47)
        resolve(catalog, collections)  # the config file's collections still match
    except (CatalogError, GroupError) as e:
        raise ValueError(str(e)) from None
    for s in catalog.skipped:
        log.debug("%s (%s:%d) not served: %s", s.name, catalog.path, s.line, s.reason)
    if (line := validate.duplicates_line(catalog)) is not None:
        log.warning("%s", line)
    log.info(
        "metrics file %s reloaded: %d metrics, %d label fields, %d rows not served "
        "(--check names them); in force from the next cycle",
        catalog.path,
        len(catalog.metrics),
        len(catalog.labels),
        len(catalog.skipped),
    )
    return catalog


async def _collecting(app: web.Application) -> AsyncIterator[None]:
    poller = app[POLLER]
    task = asyncio.create_task(poller.run(), name="collect")
    app[TASK] = task
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _save_state(poller)
    # NVML and the kubelet/API-server clients close side by side, for at most CLOSE_S:
    # a part still closing then (a thread blocked in a driver call, an import or a
    # request) is left behind, never waited for; the process exits without it.
    closing = {asyncio.ensure_future(_close_nvml(poller)): "NVML"}
    if poller.attribution is not None:
        closing[asyncio.ensure_future(poller.attribution.close())] = "kubelet/API-server clients"
    if poller.runtime is not None:
        closing[asyncio.ensure_future(poller.runtime.close())] = "container runtime client"
    _, late = await asyncio.wait(closing, timeout=CLOSE_S)
    for part in late:
        part.cancel()
        log.warning("%s did not close in %g s; exiting anyway", closing[part], CLOSE_S)
    poller.close()


async def _save_state(poller: Poller) -> None:
    """Write the accounting state once more (with --accounting-state-dir), in the worker
    thread after the cycle under way; at most CLOSE_S, then the exit goes on without it."""
    if poller.derive.state is None:
        return
    try:
        await asyncio.wait_for(
            asyncio.wrap_future(poller.executor.submit(poller.derive.save)), CLOSE_S
        )
    except (TimeoutError, RuntimeError) as e:  # a hung cycle; an executor already shut
        log.warning("accounting state not written at exit: %s", e or "timed out")


async def _close_nvml(poller: Poller) -> None:
    def close() -> None:
        # a cycle under way gets a moment to finish, rather than failing on a closed NVML
        end = time.monotonic() + CYCLE_GRACE_S
        while poller.busy and time.monotonic() < end:
            time.sleep(0.01)
        poller.collector.close(XID_GRACE_S)

    # A daemon thread, not an executor: an NVML shutdown that hangs must not hold the exit.
    closer = threading.Thread(target=close, name="nvml-close", daemon=True)
    closer.start()
    while closer.is_alive():  # polled: no executor thread waits on it
        await asyncio.sleep(0.01)


def run(cfg: Config, catalog: Catalog) -> int:
    """Serve until SIGINT/SIGTERM, then end the process with status 0 (EXIT_NVML when NVML
    became unusable); returns 2 when the address cannot be listened on."""
    app = build(cfg, catalog)
    # The collection thread's Python hands the GIL back after this long (default 5 ms),
    # so a scrape arriving mid-cycle waits at most about this much for the event loop.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # What exists now (modules, the app) lives as long as the process: out of the garbage
    # collector's full passes, which would otherwise scan it all (10 to 20 ms with the GIL).
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(server.serve(app, cfg))
    except server.BindError as e:
        log.error("%s", e)
        return 2
    poller = app[POLLER]
    if poller.busy:
        # The worker thread is inside an NVML call that does not return; Python would wait
        # for it at exit, past the pod's grace period.
        log.warning(
            "exiting while an NVML call is still running (%s)",
            poller.collector.busy_with or "NVML",
        )
    # Everything is closed and nothing is left to save: skip the interpreter's teardown
    # (freeing every module, library exit hooks, threads still importing), which takes up
    # to a second on a busy node and would eat into the 2 s a stop may take.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(signals.exit_status())
