"""Signals: SIGHUP fanned out to every config file's reloader, SIGTERM/SIGINT to stop.

A process has one handler per signal, so :class:`Hangup` owns SIGHUP and wakes each
subscriber (metrics file, web config, fleet). Reloads are coalesced: a reloader runs
at most once per :data:`COALESCE_S`, however many signals arrive, so a SIGHUP storm
costs next to nothing. Each reload's outcome is recorded in :class:`ReloadStatus`,
per file kind, for the self-metrics (as Prometheus's config_last_reload_successful).
A file that fails to load leaves the last good one in force; the log says why in one
line, never quoting the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from aiohttp import web

log = logging.getLogger(__name__)

COALESCE_S = 1.0
"""Least time between two reloads of one file, seconds: signals in between are merged."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """The last load of one config file: did it succeed, and when it last did (unix s)."""

    ok: bool
    last_success_unix: float


class ReloadStatus:
    """Outcome of the last load per config file kind ("metrics_file", "web_config", "fleet")."""

    def __init__(self) -> None:
        self._results: dict[str, ReloadResult] = {}

    def record(self, kind: str, ok: bool, when: float | None = None) -> None:
        """Record a load of ``kind``; ``when`` defaults to now (unix seconds)."""
        now = time.time() if when is None else when
        last = self._results.get(kind)
        success = now if ok else (last.last_success_unix if last else 0.0)
        self._results[kind] = ReloadResult(ok, success)

    def get(self, kind: str) -> ReloadResult | None:
        return self._results.get(kind)

    def items(self) -> tuple[tuple[str, ReloadResult], ...]:
        """(kind, result) pairs, sorted by kind."""
        return tuple(sorted(self._results.items()))


class Hangup:
    """Wakes each subscriber on SIGHUP while the application runs."""

    def __init__(self) -> None:
        self._subscribers: list[asyncio.Event] = []

    def subscribe(self, wake: asyncio.Event) -> Callable[[], None]:
        """Set ``wake`` on every SIGHUP; returns the unsubscriber."""
        self._subscribers.append(wake)
        return lambda: self._subscribers.remove(wake)

    def fire(self) -> None:
        """Deliver one SIGHUP (the signal handler; tests call it directly)."""
        for wake in self._subscribers:
            wake.set()


HANGUP = web.AppKey("hangup", Hangup)
RELOADS = web.AppKey("reloads", ReloadStatus)


def install(app: web.Application) -> Hangup:
    """Own SIGHUP for ``app`` (and a ReloadStatus under RELOADS) while it runs."""
    hangup = Hangup()
    app[HANGUP] = hangup
    app[RELOADS] = ReloadStatus()

    async def handling(_app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        installed = False
        # not possible outside the main thread (tests running an app in a thread)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, hangup.fire)
            installed = True
        yield
        if installed:
            loop.remove_signal_handler(signal.SIGHUP)

    app.cleanup_ctx.insert(0, handling)
    return hangup


def subscribe(app: web.Application, wake: asyncio.Event) -> Callable[[], None] | None:
    """Subscribe to the app's SIGHUP; None when the app has no :class:`Hangup`."""
    hangup = app.get(HANGUP)
    return hangup.subscribe(wake) if hangup is not None else None


_stops: list[Callable[[], None]] = []  # what on_stop was given, while installed
_exit_status = [0]


def on_stop(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop`` on SIGTERM and SIGINT (in the running loop), and on
    :func:`request_stop`; returns the remover."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    _stops.append(stop)

    def remove() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        _stops.remove(stop)

    return remove


def request_stop(status: int) -> None:
    """Stop the process as SIGTERM does, to exit with ``status`` (call in the loop)."""
    _exit_status[0] = status
    for stop in list(_stops):
        stop()


def exit_status() -> int:
    """The status the process exits with: 0, or what :func:`request_stop` was given."""
    return _exit_status[0]


def exit_after(seconds: float) -> threading.Timer:
    """End the process with :func:`exit_status` after ``seconds`` unless it ended before.

    The graceful stop closes connections, NVML and the kubelet and API-server clients;
    a part that hangs (a driver call, a thread importing a library, a client that never
    reads) must not keep the pod past its grace period. A daemon thread, so a clean
    exit does not wait for it.
    """

    def force() -> None:
        log.warning("stop did not finish in %g s; exiting now", seconds)
        logging.shutdown()
        os._exit(exit_status())

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
    return timer


async def reloading(
    wake: asyncio.Event,
    reload: Callable[[bool], Awaitable[object]],
    what: str,
    poll_s: float | None = None,
) -> None:
    """Call ``reload(forced)`` on each wake (forced=True) or every ``poll_s`` (False),
    at most once per COALESCE_S; a surprise is logged and the loop goes on."""
    while True:
        if poll_s is None:
            await wake.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), poll_s)
        forced = wake.is_set()
        wake.clear()
        try:
            await reload(forced)
        except Exception as e:  # never let a surprise stop the reloading
            log.error("%s: reload failed unexpectedly (%s)", what, type(e).__name__)
        await asyncio.sleep(COALESCE_S)


class FileReload(Generic[T]):
    """Reloads one config file on SIGHUP: read and validate off the event loop with
    ``load`` (raises ValueError with a one-line message), then ``apply`` in the loop."""

    def __init__(
        self,
        kind: str,
        path: str,
        read: Callable[[str], str],
        load: Callable[[str], T],
        apply: Callable[[T], None],
        status: ReloadStatus,
        keeping: str = "still using the last good one",
    ) -> None:
        self.kind, self.path = kind, path
        self._read, self._load, self._apply = read, load, apply
        self._status = status
        self._keeping = keeping
        self.last: str | None = None  # text of the version in force

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            self.last = await loop.run_in_executor(None, self._read, self.path)
        self._status.record(self.kind, True)

    async def reload(self, _forced: bool = True) -> bool:
        """Reload if the text changed; True when a new version is in force."""
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(None, self._read, self.path)
            if text == self.last:
                log.info("%s %s unchanged", self.kind.replace("_", " "), self.path)
                return False
            value = await loop.run_in_executor(None, self._load, self.path)
        except (ValueError, OSError) as e:
            self._status.record(self.kind, False)
            log.error("%s; %s", str(e).splitlines()[0][:300], self._keeping)
            return False
        self._apply(value)
        self.last = text
        self._status.record(self.kind, True)
        return True


def watch(app: web.Application, reloader: FileReload[T]) -> None:
    """Run ``reloader`` on the app's SIGHUP while the app runs."""

    async def watching(app: web.Application) -> AsyncIterator[None]:
        await reloader.start()
        wake = asyncio.Event()
        unsubscribe = subscribe(app, wake)
        task = asyncio.create_task(
            reloading(wake, reloader.reload, reloader.path), name=f"{reloader.kind}-reload"
        )
        yield
        if unsubscribe is not None:
            unsubscribe()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watching)
