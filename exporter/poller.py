"""The collection loop: NVML work in one worker thread, then the exposition built from it.

A cycle is three stages, one direction: collect (the collector: NVML -> a frozen
Snapshot), then pod attribution on the event loop, then derive (derive/stage.py: the
state across cycles -> a frozen Frame) and render (exposition/: Frame -> bytes), both
in the worker thread, as the ``publish`` step.

Each interval the poller hands one cycle to a single worker thread and waits
at most the collect timeout. A cycle that overruns is left to finish on its
own (no second thread is started while it hangs, so threads never pile up)
and scrapes keep getting the last exposition, whose self-metrics show the age.
Cancelling :meth:`Poller.run` ends it at once, even while the worker hangs in
an NVML call: the wait never shields the worker's future from cancellation.

No value can end the loop: each step of a cycle (collect, attribution, publish) that
raises is counted (``gpu_exporter_cycle_step_failures_total{step}``) and logged at most
once a minute, and scrapes keep the last exposition; the next interval tries again.
Collections with an interval of their own (--config-file) are read between
cycles, in the same worker thread: each reads only its fields, and the
exposition is rendered again with them (unchanged families are reused).
NVML unusable as a whole (no driver, a library that does not match the kernel
module) ends the loop after one error line: the process exits with EXIT_NVML so
that the kubelet restarts it, since only a new process loads the driver's library.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from exporter.catalog.groups import resolve
from exporter.catalog.metricsfile import Catalog
from exporter.collector import Collector
from exporter.derive.stage import Derive
from exporter.exposition.build import Builder, Exposition
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.frame import Held, Workloads
from exporter.nvml.session import NO_DRIVER, DriverGone
from exporter.runtime.heap import Trimmer, limit_arenas
from exporter.runtime.ratelimit import RateLimited
from exporter.snapshot import CollectorResult, Snapshot
from exporter.workloads.sightings import SIGHT_S

if TYPE_CHECKING:
    from exporter.workloads.attribution import Attribution
    from exporter.workloads.containers import Runtime
    from exporter.workloads.hpcjobs import JobFiles

log = logging.getLogger(__name__)

STEPS = ("collect", "attribution", "publish")
"""The steps of a cycle, as the ``step`` label of gpu_exporter_cycle_step_failures_total."""

STUCK_LOG_S = 60.0  # a hung cycle is logged when found, then at most this often
STEP_LOG_S = 60.0  # a failing step of the cycle is logged at most this often
EXIT_NVML = 3  # the process's exit status when NVML is unusable
NO_DRIVER_HINT = (
    " (no NVIDIA driver on this host: to try the exporter without one, --simulate serves "
    "a simulated node)"
)


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
        self.derive = Derive(cfg)  # cfg: the DCGM_EXP_* windows, accounting's settings
        self.builder = Builder(self.selfmetrics, cfg)  # cfg: -d, the release's labels
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self.snapshot: Snapshot | None = None
        self.last_ok_monotonic: float | None = None
        self.stuck = ""  # why the current cycle has not finished, when it overran
        self._pending: Future[Snapshot | None] | None = None
        self._next_catalog: Catalog | None = None
        self._stuck_logged = float("-inf")
        self._step_logs = {step: RateLimited(STEP_LOG_S) for step in STEPS}
        self.failing = ""  # why the last cycle's attribution or publish failed, if it did
        self._started = 0.0  # monotonic start of the cycle in the worker
        self.exit_status = 0  # EXIT_NVML once NVML is unusable: run() has ended
        self.on_fatal: Callable[[], None] = lambda: None  # then called, once
        self._trimmer = Trimmer()
        self.collections = getattr(cfg, "collections", ())
        self.simulated = bool(getattr(cfg, "simulate", False))  # no --simulate hint then
        job_dir, socket = getattr(cfg, "hpc_job_dir", None), getattr(cfg, "container_socket", None)
        self.job_files: JobFiles | None = None
        if job_dir:  # the job files' reader and the container client: only when asked for
            from exporter.workloads.hpcjobs import JobFiles

            self.job_files = JobFiles(job_dir)
        self.runtime: Runtime | None = None
        if socket:
            from exporter.workloads.containers import Runtime

            self.runtime = Runtime(socket, interval_s)
        self._workloads: Workloads | None = None
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
        """Collect at the interval, and each group at its own, until cancelled or until NVML
        is unusable."""
        loop = asyncio.get_running_loop()
        groups = self.collector.groups
        # a cycle reads every collection not read yet (the first cycle's and a reload's),
        # so each is due again an interval of its own later
        now = loop.time()
        due = [now, *(now + g.interval_s for g in groups)]
        while True:
            i = min(range(len(due)), key=due.__getitem__)
            await self._sleep_until(due[i])
            try:
                if i == 0:
                    await self.cycle()
                else:
                    await self.read_group(i - 1)
            except Exception as e:  # the self-metrics of a skipped or failed cycle
                self._step_failed("publish", e)
            if self.exit_status:
                return
            every = self.interval_s if i == 0 else groups[i - 1].interval_s
            due[i] += every
            now = loop.time()
            if due[i] < now:  # fell behind: skip missed ticks instead of bursting
                due[i] = now + every
            if self.collector.groups is not groups:  # a reload changed them
                groups = self.collector.groups
                due = [due[0], *(now + g.interval_s for g in groups)]

    async def _sleep_until(self, when: float) -> None:
        """Sleep until ``when`` (the loop's clock); with pod attribution at intervals longer
        than SIGHT_S, asking the kubelet every SIGHT_S meanwhile who holds what, so that
        accounting sees pods shorter than the interval (workloads/sightings.py)."""
        loop = asyncio.get_running_loop()
        attr = self.attribution
        if attr is not None and self.interval_s > SIGHT_S:
            while when - loop.time() > SIGHT_S:
                await asyncio.sleep(SIGHT_S)
                await attr.sight(self.collector.clock())
        await asyncio.sleep(max(0.0, when - loop.time()))

    async def read_group(self, i: int) -> None:
        """Read group ``i`` and publish, unless the worker is still busy (then skipped)."""
        if self.busy:
            return
        self._pending = self.executor.submit(self.collector.collect_group, i)
        try:
            snap = await self._wait(self._pending)
        except Exception as e:  # timed out (the next cycle reports it) or a bug: keep going
            log.debug("reading collection %s failed: %r", self.collector.groups[i].name, e)
            return
        if snap is not None:
            await asyncio.wrap_future(self.executor.submit(self.publish, snap, True))

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
            self.collector.set_catalog(self.catalog, resolve(self.catalog, self.collections))
            self.selfmetrics.skipped_rows = self.catalog.skipped
        self._started = time.monotonic()
        if self.runtime is not None:  # beside the cycle: it uses the last answer
            self.runtime.start()
        self._pending = self.executor.submit(self.collector.collect)
        try:
            snap = await self._wait(self._pending)
        except DriverGone as e:
            self._fatal(e)
            return
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
            self._step_failed("collect", e)
            self._publish_self()
            return
        if self.stuck:
            log.warning("collection cycles finish again")
            self._stuck_logged = float("-inf")
        self.stuck = ""
        self.failing = ""
        await self._attribute_and_publish(snap)

    async def _attribute_and_publish(self, snap: Snapshot) -> None:
        """Pods and containers for the cycle's devices, then the exposition; a step that
        raises leaves the last of its output in place."""
        if self.attribution is not None:
            try:
                await self.attribution.refresh(snap)
            except Exception as e:  # publish with the pod map as it stands
                self._step_failed("attribution", e)
        try:
            # Render and gzip in the worker thread too, so the event loop keeps serving scrapes.
            await asyncio.wrap_future(self.executor.submit(self.publish, snap))
        except Exception as e:  # the last exposition stays; its self-metrics are redone
            self._step_failed("publish", e)
            try:
                self._publish_self()
            except Exception:  # a self-metric is the bad value: all of the last one stays
                log.debug("self-metrics not rebuilt either", exc_info=True)

    def _step_failed(self, step: str, e: Exception) -> None:
        """Count a step that raised and log it, one line a minute per step (the traceback
        at debug level): a value from a peer may fail every cycle."""
        self.selfmetrics.step_failures[step] += 1
        why = f"{type(e).__name__}: {e}".encode("ascii", "backslashreplace").decode()[:300]
        if step != "collect":
            self.failing = f"the {step} step of the last cycle failed ({why})"
        self._step_logs[step].log(
            log, logging.ERROR, "collection cycle: %s failed (%s); serving the last exposition",
            step, why,
        )  # fmt: skip
        log.debug("%s step failed", step, exc_info=e)

    async def _wait(self, pending: Future[Any]) -> Any:
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

    def _fatal(self, why: DriverGone) -> None:
        """NVML is unusable: say so once and end the loop; the process is to exit."""
        self.selfmetrics.collections["failure"] += 1
        self.exit_status = EXIT_NVML
        no_driver = why.function == "nvmlInit" and why.code in NO_DRIVER and not self.simulated
        log.error(
            "NVML unusable: %s; exiting (status %d) so that the container restarts "
            "with the driver's library as installed now%s",
            why,
            EXIT_NVML,
            NO_DRIVER_HINT if no_driver else "",
        )
        self.on_fatal()

    def _warn_stuck(self) -> None:
        """Log a hung cycle once a minute, not once per interval."""
        now = time.monotonic()
        if now - self._stuck_logged >= STUCK_LOG_S:
            self._stuck_logged = now
            log.warning("%s; serving the last snapshot", self.stuck)

    def publish(self, snap: Snapshot, group: bool = False) -> None:
        """Derive the frame of a snapshot and render the exposition that scrapes serve.
        When the DCGM part cannot be rendered, it raises before anything of the cycle is
        published (the derived state has advanced: the next cycle carries on from it).

        ``group``: the snapshot of a cycle with a group's newer values; the cycle's
        counts, windows, health and accounts stay as they are.
        """
        sm = self.selfmetrics
        attr = self.attribution
        workloads = self._workloads if group else self.workloads(snap)
        uses = None
        unknown = ""
        windows = None
        if attr is None:
            held = Held(workloads=workloads)
        else:
            held = Held(
                attr.holders(),
                tuple(attr.splits(snap)),
                attr.sharers(),
                workloads,
                attr.unhealthy(),
            )
            uses = None if group else attr.usage(snap)
            unknown = attr.unknown(snap.taken_at)
            windows = None if group else attr.windows()
        if group:
            frame = self.derive.again(snap, held)
        else:
            driver = self.collector.session.driver_version
            frame = self.derive.cycle(snap, self.catalog, held, uses, unknown, driver, windows)
        series = self.builder.render(frame, self.catalog)
        if attr is not None:
            ok = not attr.mapper.status
            sm.extra_results = (CollectorResult("podresources", ok, attr.duration),)
        sm.series = series
        if self.job_files is not None or self.runtime is not None:
            sm.copies_dropped = self.builder.copies_dropped
        self.snapshot = snap
        sm.snapshot = snap
        if not group:
            self._workloads = workloads
            s = self.collector.session
            sm.nvml_up = s.up
            sm.driver_version, sm.nvml_version = s.driver_version, s.nvml_version
            if snap.ok:
                sm.collections["success"] += 1
                sm.last_success = snap.taken_at
            else:
                sm.collections["failure"] += 1
        self._publish_self()
        if group:
            return
        if snap.ok:  # only now: /ready must not say yes before /metrics has the series
            self.last_ok_monotonic = time.monotonic()
        self._trimmer.tick()  # the old expositions' memory, freed here, back to the OS

    def workloads(self, snap: Snapshot) -> Workloads | None:
        """This cycle's HPC jobs (job files read now) and containers holding devices."""
        if self.job_files is None and self.runtime is None:
            return None
        job_map: Mapping[str, tuple[str, ...]] = {}
        if self.job_files is not None:
            job_map = self.job_files.by_device(snap.gpus + snap.entities)
        held = {}
        if self.runtime is not None:
            from exporter.workloads.containers import by_device

            held = by_device(self.runtime.held, snap.gpus + snap.entities)
        return Workloads(job_map, held)

    def _publish_self(self) -> None:
        sm = self.selfmetrics
        sm.nvml_errors = self.collector.session.error_counts()
        self.exposition = self.builder.build()

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons and details) for /ready."""
        details = list(self.snapshot.problems) if self.snapshot else []
        if self.attribution is not None:
            details += self.attribution.details()
        if self.failing:
            details.insert(0, self.failing)
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
