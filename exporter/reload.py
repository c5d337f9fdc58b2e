"""SIGHUP: one handler for the application, and the metrics-file reload it triggers.

A process has one SIGHUP handler, and both the metrics file and the web config
(webconfig.py) reload on it, so :class:`Hangup` owns the handler and calls every
subscriber. The metrics file is read and validated off the event loop; a file
that does not load leaves the last good one in force and the log says why. A good
one takes effect between two collection cycles (:meth:`Poller.reload`), so every
exposition served is complete and rendered from one version of the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from exporter.catalog import Catalog, CatalogError, load
from exporter.poller import Poller

log = logging.getLogger(__name__)


class Hangup:
    """Calls each subscriber on SIGHUP while the application runs."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (in the event loop) on every SIGHUP; returns the unsubscriber."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def fire(self) -> None:
        """Deliver one SIGHUP (the signal handler; tests call it directly)."""
        for callback in list(self._subscribers):
            callback()


HANGUP = web.AppKey("hangup", Hangup)


def install(app: web.Application, poller: Poller, metrics_file: str) -> Hangup:
    """Own SIGHUP for ``app`` and reload ``metrics_file`` into ``poller`` on it."""
    hangup = Hangup()
    app[HANGUP] = hangup

    async def handling(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        installed = False
        # not possible outside the main thread (tests running an app in a thread)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, hangup.fire)
            installed = True
        wake = asyncio.Event()
        unsubscribe = hangup.subscribe(wake.set)
        task = asyncio.create_task(_reloading(wake, poller, metrics_file), name="metrics-reload")
        yield
        unsubscribe()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if installed:
            loop.remove_signal_handler(signal.SIGHUP)

    app.cleanup_ctx.append(handling)
    return hangup


def subscribe(app: web.Application, callback: Callable[[], None]) -> Callable[[], None] | None:
    """Subscribe to the app's SIGHUP; None when the app has no :class:`Hangup`."""
    hangup = app.get(HANGUP)
    return hangup.subscribe(callback) if hangup is not None else None


async def _reloading(wake: asyncio.Event, poller: Poller, path: str) -> None:
    last = await asyncio.get_running_loop().run_in_executor(None, _read, path)
    while True:
        await wake.wait()
        wake.clear()
        try:
            last = await reload_metrics(poller, path, last)
        except Exception:  # never let a surprise stop the reloading
            log.exception("metrics file %s: reload failed", path)


async def reload_metrics(poller: Poller, path: str, last: str | None) -> str | None:
    """Reload ``path`` if its text changed since ``last``; returns the text now in force."""
    loop = asyncio.get_running_loop()
    text = await loop.run_in_executor(None, _read, path)
    if text is not None and text == last:
        log.info("metrics file %s unchanged", path)
        return last
    try:
        catalog = await loop.run_in_executor(None, load, path, poller.catalog.old_names)
    except CatalogError as e:
        log.error("%s; still collecting with the last good metrics file", e)
        return last
    _log_loaded(catalog)
    poller.reload(catalog)
    return text


def _log_loaded(catalog: Catalog) -> None:
    for s in catalog.skipped:
        log.warning("%s (%s:%d) not served: %s", s.name, catalog.path, s.line, s.reason)
    log.info(
        "metrics file %s reloaded: %d metrics, %d label fields; in force from the next cycle",
        catalog.path,
        len(catalog.metrics),
        len(catalog.labels),
    )


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # load() says why
