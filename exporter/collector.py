"""One collection cycle over NVML, run in the poller's worker thread.

A cycle enumerates devices, reads device-level fields once per physical GPU and
instance-level fields once per whole GPU or MIG instance, samples GPM, and
copies the XID counters, producing a :class:`Snapshot`. A lost GPU does not
stop the others; a GPU whose calls turn slow is set aside for a while; a
driver that went away is re-initialised with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from exporter.accounting.plan import ALWAYS_READ
from exporter.catalog import Catalog
from exporter.nvml.devices import Device, Enumerator, Inventory
from exporter.nvml.events import XidState, XidWatcher
from exporter.nvml.fields import FIELDS, Field, Scope, Source, with_inputs
from exporter.nvml.gpm import GpmReader
from exporter.nvml.p2p import P2PReader, P2PSeries
from exporter.nvml.prime import prime_new_devices
from exporter.nvml.processes import ProcessReader, ProcUse
from exporter.nvml.reader import FieldReader
from exporter.nvml.session import DeviceLost, DriverGone, NvmlProblem, Session
from exporter.snapshot import CollectorResult, Snapshot, Value

log = logging.getLogger(__name__)

# Which devices' process lists a cycle reads: (device key, its values so far) -> yes/no
Wanted = Callable[[str, Mapping[str, Value]], bool]
QUARANTINE_S = 60.0
MAX_BACKOFF_S = 30.0


class Collector:
    """Owns the NVML session and everything read through it."""

    def __init__(
        self,
        catalog: Catalog,
        hostname: str,
        hostname_label: str = "Hostname",
        slow_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        wants_processes: Callable[[], Wanted] | None = None,
    ) -> None:
        fields = _fields(catalog)
        self.session = Session()
        self.enumerator = Enumerator(
            self.session, hostname, hostname_label, [m.field for m in catalog.labels]
        )
        self.reader = FieldReader(self.session, fields)
        self.gpm = GpmReader(self.session, fields)
        self.xid: XidWatcher | None = None
        self.p2p: P2PReader | None = None
        self._start_watchers(fields)
        self.processes = ProcessReader(self.session)
        self.wants_processes = wants_processes
        self.slow_s = slow_s
        self.clock = clock
        self.busy_with = ""  # what the worker is reading now, for /ready when a call hangs
        self._quarantine: dict[str, float] = {}
        self._retry_at = 0.0
        self._backoff = 1.0
        self._down_reason = ""
        self._inventory = Inventory()

    def set_catalog(self, catalog: Catalog) -> None:
        """Read the fields ``catalog`` lists from the next cycle on (metrics-file reload).

        Call it between cycles, never while the worker thread runs one. What is
        known about devices (identities, unsupported fields, GPM samples, XID
        counts) is kept; label fields that changed are read again.
        """
        fields = _fields(catalog)
        self.reader.set_fields(fields)
        self.gpm.set_fields(fields)
        self.enumerator.set_label_fields([m.field for m in catalog.labels])
        self._start_watchers(fields)

    def _start_watchers(self, fields: list[Field]) -> None:
        """The XID event thread and the P2P reader, once some field needs them."""
        if self.xid is None and any(f.source is Source.XID for f in fields):
            self.xid = XidWatcher(self.session)
        if self.p2p is None and any(f.source is Source.P2P for f in fields):
            self.p2p = P2PReader(self.session)

    def close(self, xid_grace_s: float | None = None) -> None:
        """Stop the XID thread, free the GPM samples and shut NVML down.

        ``xid_grace_s``: how long the XID thread gets to leave its wait (default: as
        long as it takes). If it is still waiting then, NVML is left for the process's
        exit to release: shutting it down under a thread inside a call is not safe.
        """
        ended = self.xid.stop(xid_grace_s) if self.xid is not None else True
        self.gpm.close()
        if ended:
            self.session.close()
        else:
            log.debug("XID thread still in its wait; NVML is released at exit")

    def _ensure_open(self, now: float) -> None:
        if self.session.up:
            return
        if now < self._retry_at:
            raise DriverGone(self._down_reason)
        try:
            self.session.open()
        except DriverGone:
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
            raise
        self._backoff = 1.0
        self._down_reason = ""
        self.enumerator.reset()
        gone = [d.key for d in self._inventory.gpus + self._inventory.instances]
        self.reader.forget(gone)
        self.gpm.forget(gone)
        self._inventory = Inventory()
        log.info("NVML initialised: driver %s", self.session.driver_version)

    def collect(self) -> Snapshot:
        """Run one cycle; on a driver failure returns a snapshot with no device values."""
        start = self.clock()
        t0 = time.perf_counter()
        results: list[CollectorResult] = []
        problems: list[str] = []
        try:
            self._ensure_open(start)
            inv = self.enumerator.enumerate()
        except DriverGone as e:
            return self._failed(start, t0, str(e))
        results.append(CollectorResult("enumerate", True, time.perf_counter() - t0))
        self._forget_gone(inv)
        self._inventory = inv

        values: dict[str, dict[str, Value]] = {}
        procs: dict[str, tuple[ProcUse, ...]] = {}
        wanted = self.wants_processes() if self.wants_processes else None
        down: list[Device] = list(inv.lost)
        for d in inv.lost:
            problems.append(f"GPU {d.index} ({d.uuid}) is not answering (lost)")
        t_fields = 0.0
        p0 = time.perf_counter()  # new devices: first samples, so PROF_* and rates come now
        prime_new_devices(
            self.reader, self.gpm, inv, start, lambda k: self._quarantine.get(k, 0.0) > start
        )
        t_gpm = time.perf_counter() - p0
        gpus_ok: list[Device] = []
        by_parent: dict[str, list[Device]] = {}
        for m in inv.instances:
            assert m.parent is not None
            by_parent.setdefault(m.parent.key, []).append(m)
        try:
            for gpu in inv.gpus:
                until = self._quarantine.get(gpu.key, 0.0)
                if until > start:
                    down.append(gpu)
                    problems.append(
                        f"GPU {gpu.index} ({gpu.uuid}) set aside for {until - start:.0f} s "
                        "more: its NVML calls were slow"
                    )
                    continue
                g0 = time.perf_counter()
                members = [gpu] if gpu.key not in inv.mig_enabled else by_parent.get(gpu.key, [])
                try:
                    gpm_s = self._read_gpu(gpu, members, start, wanted, values, procs)
                except DeviceLost as e:
                    for dev in [gpu, *members]:
                        values.pop(dev.key, None)
                    down.append(gpu)
                    problems.append(f"GPU {gpu.index} ({gpu.uuid}) is lost: {e}")
                    log.warning("GPU %d (%s) lost: %s", gpu.index, gpu.uuid, e)
                    continue
                spent = time.perf_counter() - g0
                t_gpm += gpm_s
                t_fields += spent - gpm_s
                self._check_slow(gpu, spent)
                gpus_ok.append(gpu)
        except DriverGone as e:
            return self._failed(start, t0, str(e))
        finally:
            self.busy_with = ""
        results.append(CollectorResult("fields", True, t_fields))
        results.append(CollectorResult("gpm", True, t_gpm))

        xid_state = XidState()
        if self.xid is not None:
            x0 = time.perf_counter()
            err = ""
            try:
                self.xid.watch(inv.gpus)
            except NvmlProblem as e:
                err = str(e)
            xid_state = self.xid.state()
            ok = not err and self.xid.healthy
            results.append(CollectorResult("xid", ok, time.perf_counter() - x0, err))
        p2p = self._read_p2p(gpus_ok)
        live = {d.key for d in gpus_ok}
        entities = tuple(e for e in inv.entities() if (e.parent or e).key in live)
        self.session.summarize_unsupported()
        return Snapshot(
            taken_at=start,
            duration=time.perf_counter() - t0,
            gpus=tuple(gpus_ok),
            entities=entities,
            down=tuple(down),
            values=MappingProxyType({k: MappingProxyType(v) for k, v in values.items()}),
            xid=xid_state,
            p2p=p2p,
            processes=MappingProxyType(procs),
            collectors=tuple(results),
            problems=tuple(problems),
        )

    def _read_gpu(
        self,
        gpu: Device,
        members: list[Device],
        start: float,
        wanted: Wanted | None,
        values: dict[str, dict[str, Value]],
        procs: dict[str, tuple[ProcUse, ...]],
    ) -> float:
        """Read one GPU and its instances into ``values``/``procs``; returns GPM seconds."""
        self.busy_with = f"GPU {gpu.index} ({gpu.uuid})"
        values[gpu.key] = self.reader.read(gpu, Scope.DEVICE)
        gpm_s = 0.0
        for dev in members:
            vals = values.setdefault(dev.key, {})
            vals.update(self.reader.read(dev, Scope.INSTANCE))
            p0 = time.perf_counter()
            vals.update(self.gpm.read(dev, start))
            gpm_s += time.perf_counter() - p0
            if wanted is not None and wanted(dev.key, vals):
                procs[dev.key] = self.processes.read(dev)
        return gpm_s

    def _read_p2p(self, gpus: list[Device]) -> Mapping[str, tuple[P2PSeries, ...]]:
        """P2P status series by GPU key (read again only when the set of GPUs changes)."""
        if self.p2p is None:
            return MappingProxyType({})
        self.busy_with = "P2P status"
        by_index = self.p2p.read(gpus)
        self.busy_with = ""
        return MappingProxyType({g.key: by_index[g.index] for g in gpus if g.index in by_index})

    def _check_slow(self, gpu: Device, spent: float) -> None:
        """Set a GPU aside for QUARANTINE_S when its calls took longer than ``slow_s``."""
        if spent > self.slow_s:
            self._quarantine[gpu.key] = self.clock() + QUARANTINE_S
            log.warning(
                "GPU %d (%s): NVML calls took %.1f s; skipping it for %.0f s",
                gpu.index,
                gpu.uuid,
                spent,
                QUARANTINE_S,
            )

    def _forget_gone(self, inv: Inventory) -> None:
        now = {d.key for d in inv.gpus + inv.instances}
        old = {d.key for d in self._inventory.gpus + self._inventory.instances}
        gone = old - now
        if gone:
            self.reader.forget(gone)
            self.gpm.forget(gone)

    def _failed(self, start: float, t0: float, why: str) -> Snapshot:
        if self.xid is not None:
            self.xid.stop()
        if why != self._down_reason:
            log.warning("collection failed: %s; retrying with backoff", why)
            self._down_reason = why
        return Snapshot(
            taken_at=start,
            duration=time.perf_counter() - t0,
            down=self._inventory.gpus,
            collectors=(CollectorResult("enumerate", False, time.perf_counter() - t0, why),),
            problems=(f"NVML unusable: {why}",),
        )


def _fields(catalog: Catalog) -> list[Field]:
    """The catalog's fields and their inputs, plus what accounting needs every cycle
    (energy, utilization, memory used; GPM activity only when the catalog reads it)."""
    listed = [m.field for m in catalog.metrics]
    names = {f.name for f in listed}
    extra = [FIELDS[n] for n in ALWAYS_READ if n not in names]
    return with_inputs([*listed, *extra])
