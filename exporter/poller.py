"""The collection loop: NVML work in one worker thread, then the exposition built from it.

Each interval the poller hands one cycle to a single worker thread and waits
at most the collect timeout. A cycle that overruns is left to finish on its
own (no second thread is started while it hangs, so threads never pile up)
and scrapes keep getting the last exposition, whose self-metrics show the age.
Cancelling :meth:`Poller.run` ends it at once, even while the worker hangs in
an NVML call: the wait never shields the worker's future from cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from exporter.catalog import Catalog
from exporter.collector import Collector
from exporter.exposition.build import Builder, Exposition
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.heap import Trimmer, limit_arenas
from exporter.snapshot import CollectorResult, Snapshot

if TYPE_CHECKING:
    from exporter.kube.attribution import Attribution

log = logging.getLogger(__name__)

STUCK_LOG_S = 60.0  # a hung cycle is logged when found, then at most this often


class Poller:
    """Runs the collector every interval and publishes the rendered exposition."""

    def __init__(
        self,
        catalog: Catalog,
        collector: Collector,
        interval_s: float,
        timeout_s: float,
        attribution: Attribution | None = None,
        cfg: Any = None,
    ) -> None:
        self.catalog = catalog
        self.collector = collector
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.attribution = attribution
        limit_arenas()  # before the worker thread allocates anything
        self.selfmetrics = SelfMetrics(interval_s, attribution.status if attribution else None)
        self.selfmetrics.skipped_rows = catalog.skipped
        self.builder = Builder(self.selfmetrics, cfg)  # cfg: -d and the DCGM_EXP_* windows
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self.snapshot: Snapshot | None = None
        self.last_ok_monotonic: float | None = None
        self.stuck = ""  # why the current cycle has not finished, when it overran
        self._pending: Future[Snapshot] | None = None
        self._next_catalog: Catalog | None = None
        self._stuck_logged = float("-inf")
        self._crash_logged = ""
        self._started = 0.0  # monotonic start of the cycle in the worker
        self.cycles = 0  # snapshots published (benchmarks/churn.py reads it)
        self._trimmer = Trimmer()
        self.exposition: Exposition = self.builder.build()

    @property
    def busy(self) -> bool:
        """Whether the worker thread is still inside a cycle (an NVML call may hang)."""
        return self._pending is not None and not self._pending.done()

    def reload(self, catalog: Catalog) -> None:
        """Collect and expose ``catalog`` from the next cycle on (SIGHUP, reload.py).

        Taking effect between cycles means every exposition is rendered from one
        catalog: scrapes see the old series set until the new one is complete.
        """
        self._next_catalog = catalog

    async def run(self) -> None:
        """Collect forever at the interval (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.cycle()
            next_at += self.interval_s
            now = loop.time()
            if next_at < now:  # fell behind: skip missed ticks instead of bursting
                next_at = now + self.interval_s
            await asyncio.sleep(next_at - now)

    async def cycle(self) -> None:
        """One collection: submit to the worker unless it is still busy, then publish."""
        if self.busy:
            self.selfmetrics.collections["skipped"] += 1
            self.stuck = (
                f"collection has not finished for {time.monotonic() - self._started:.0f} s "
                f"(busy reading {self.collector.busy_with or 'NVML'})"
            )
            self._warn_stuck()
            self._publish_self()
            return
        if self._next_catalog is not None:
            self.catalog, self._next_catalog = self._next_catalog, None
            self.collector.set_catalog(self.catalog)
            self.selfmetrics.skipped_rows = self.catalog.skipped
        self._started = time.monotonic()
        self._pending = self.executor.submit(self.collector.collect)
        try:
            snap = await self._wait(self._pending)
        except TimeoutError:
            self.selfmetrics.collections["failure"] += 1
            self.stuck = (
                f"collection exceeded {self.timeout_s:g} s "
                f"(busy reading {self.collector.busy_with or 'NVML'})"
            )
            self._warn_stuck()
            self._publish_self()
            return
        except Exception as e:  # a bug or an NVML answer nobody planned for
            # The loop must outlive it (a dead loop fails /health and restarts the pod):
            # count it, keep serving the last exposition, and try again next interval.
            self.selfmetrics.collections["failure"] += 1
            if str(e) != self._crash_logged:
                self._crash_logged = str(e)
                log.exception("collection cycle failed; serving the last snapshot")
            self._publish_self()
            return
        if self.stuck:
            log.warning("collection cycles finish again")
            self._stuck_logged = float("-inf")
        self.stuck = ""
        if self.attribution is not None:
            await self.attribution.refresh(snap)
        # Render and gzip in the worker thread too, so the event loop keeps serving scrapes.
        await asyncio.wrap_future(self.executor.submit(self.publish, snap))

    async def _wait(self, pending: Future[Snapshot]) -> Snapshot:
        """The cycle's snapshot; TimeoutError after the collect timeout.

        asyncio.wait neither cancels the worker's future on timeout nor holds
        back a cancellation of the caller (wait_for around shield can swallow
        one on Python 3.11), so stopping the poller never waits for NVML.
        """
        fut = asyncio.wrap_future(pending)
        # a cycle that overran may fail later, unawaited: retrieve its error so it is not logged
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _ = await asyncio.wait((fut,), timeout=self.timeout_s)
        if not done:
            raise TimeoutError
        return fut.result()

    def _warn_stuck(self) -> None:
        """Log a hung cycle once a minute, not once per interval."""
        now = time.monotonic()
        if now - self._stuck_logged >= STUCK_LOG_S:
            self._stuck_logged = now
            log.warning("%s; serving the last snapshot", self.stuck)

    def publish(self, snap: Snapshot) -> None:
        """Build the exposition that scrapes serve from a snapshot."""
        sm = self.selfmetrics
        self.snapshot = snap
        self.cycles += 1
        s = self.collector.session
        sm.snapshot = snap
        sm.nvml_up = s.up
        sm.driver_version, sm.nvml_version = s.driver_version, s.nvml_version
        if snap.ok:
            sm.collections["success"] += 1
            sm.last_success = snap.taken_at
        else:
            sm.collections["failure"] += 1
        attr = self.attribution
        if attr is None:
            sm.series = self.builder.dcgm(snap, self.catalog)
        else:
            ok = not attr.mapper.status
            sm.extra_results = (CollectorResult("podresources", ok, attr.duration),)
            sm.series = self.builder.dcgm(
                snap,
                self.catalog,
                attr.holders(),
                attr.splits(snap),
                attr.sharers(),
                attr.usage(snap),
            )
        self._publish_self()
        if snap.ok:  # only now: /ready must not say yes before /metrics has the series
            self.last_ok_monotonic = time.monotonic()
        self._trimmer.tick()  # the old expositions' memory, freed here, back to the OS

    def _publish_self(self) -> None:
        sm = self.selfmetrics
        sm.nvml_errors = self.collector.session.error_counts()
        self.exposition = self.builder.build()

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons and details) for /ready."""
        details = list(self.snapshot.problems) if self.snapshot else []
        if self.attribution is not None:
            details += self.attribution.details()
        if self.stuck:
            details.insert(0, self.stuck)
        if self.last_ok_monotonic is None:
            why = "no collection has succeeded yet"
            if self.snapshot is not None and self.snapshot.problems:
                why = self.snapshot.problems[0]
            return False, [why, *details]
        age = time.monotonic() - self.last_ok_monotonic
        if age > 3 * self.interval_s:
            return False, [f"last good collection is {age:.0f} s old (> 3 intervals)", *details]
        if not self.collector.session.up:
            return False, ["NVML is not usable", *details]
        return True, details

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
