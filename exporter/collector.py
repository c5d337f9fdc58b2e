"""One collection cycle over NVML, run in the poller's worker thread.

A cycle enumerates devices, reads device-level fields once per physical GPU and
instance-level fields once per whole GPU or MIG instance, samples GPM, and copies the
XID counters, producing a :class:`Snapshot`. A lost GPU does not stop the others; a GPU
whose calls turn slow is set aside for a while, one that reported XID 119 (GSP timeout)
until the exporter restarts (xid/fatal.py). NVML unusable as a whole (no driver, a
library of another version than the kernel module) raises :class:`DriverGone` out of
the cycle: pynvml loads its library once per process, so only a new process can use a
new driver (the poller ends it).

Fields of a collection with its own interval (exporter/catalog/groups.py) have
readers of their own: :meth:`Collector.collect_group` reads only them, on the
devices of the last cycle, and every snapshot carries each group's latest values.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from exporter.catalog.groups import Group, default_fields
from exporter.catalog.metricsfile import Catalog
from exporter.derive.accounting.plan import ALWAYS_READ
from exporter.nvml.devices import Device, Enumerator, Inventory
from exporter.nvml.fabric import FabricReader
from exporter.nvml.fields import FIELDS, Field, Scope, Source, with_inputs
from exporter.nvml.gpm import GpmReader
from exporter.nvml.p2p import P2PReader, P2PSeries
from exporter.nvml.prime import prime_new_devices
from exporter.nvml.processes import ProcessReader, ProcUse
from exporter.nvml.reader import FieldReader
from exporter.nvml.session import DeviceLost, DriverGone, NvmlProblem, Session
from exporter.nvml.xid import fatal
from exporter.nvml.xid.events import XidState, XidWatcher
from exporter.snapshot import CollectorResult, Snapshot, Value

log = logging.getLogger(__name__)

# Which devices' process lists a cycle reads: (device key, its values so far) -> yes/no
Wanted = Callable[[str, Mapping[str, Value]], bool]
QUARANTINE_S = 60.0


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
        groups: tuple[Group, ...] = (),
        kernel_log: str | None = None,
    ) -> None:
        """``wants_processes``: which devices' process lists a cycle reads (pod
        attribution and accounting); ``kernel_log``: the kernel log to read XIDs 79, 119
        and 120 from (/dev/kmsg); None: from NVML events only."""
        fields = _fields(catalog, groups)
        self.session = Session()
        self.enumerator = Enumerator(
            self.session, hostname, hostname_label, [m.field for m in catalog.labels]
        )
        self.reader = FieldReader(self.session, fields)
        self.gpm = GpmReader(self.session, fields)
        self.fabric = FabricReader(self.session, fields)
        self.xid: XidWatcher | None = None
        self.p2p: P2PReader | None = None
        self.kernel_log = kernel_log
        self._start_watchers(with_inputs(m.field for m in catalog.metrics))
        self.groups: tuple[Group, ...] = ()
        self._group_readers: list[tuple[FieldReader, GpmReader]] = []
        self._group_values: list[dict[str, dict[str, Value]]] = []  # latest, per group
        self._own: dict[str, dict[str, Value]] = {}  # the last cycle's own readings
        self._last: Snapshot | None = None  # the last cycle's snapshot
        self._set_groups(groups)
        self.processes = ProcessReader(self.session)
        self.wants_processes = wants_processes
        self.slow_s = slow_s
        self.clock = clock
        self.busy_with = ""  # what the worker is reading now, for /ready when a call hangs
        self._quarantine: dict[str, float] = {}
        self._opened = False
        self._inventory = Inventory()
        self._said_no_gpu = False  # the warning that NVML sees no GPU, given once

    def set_catalog(self, catalog: Catalog, groups: tuple[Group, ...] = ()) -> None:
        """Read the fields ``catalog`` lists from the next cycle on (metrics-file reload).

        Call it between cycles, never while the worker thread runs one. What is
        known about devices (identities, unsupported fields, GPM samples, XID
        counts) is kept; label fields that changed are read again.
        """
        fields = _fields(catalog, groups)
        self.reader.set_fields(fields)
        self.gpm.set_fields(fields)
        self.fabric.set_fields(fields)
        self.enumerator.set_label_fields([m.field for m in catalog.labels])
        self._start_watchers(with_inputs(m.field for m in catalog.metrics))
        self._set_groups(groups)

    def _set_groups(self, groups: tuple[Group, ...]) -> None:
        """Readers of their own for the fields read at another interval."""
        for _, gpm in self._group_readers:
            gpm.close()
        self.groups = groups
        self._group_readers = [
            (FieldReader(self.session, g.fields), GpmReader(self.session, g.fields)) for g in groups
        ]
        self._group_values = [{} for _ in groups]

    def _readers(self) -> list[tuple[FieldReader, GpmReader]]:
        return [(self.reader, self.gpm), *self._group_readers]

    def _start_watchers(self, fields: list[Field]) -> None:
        """The XID event thread and the P2P reader, once some field needs them."""
        if self.xid is None and any(f.source is Source.XID for f in fields):
            self.xid = XidWatcher(self.session, self.kernel_log)
        if self.p2p is None and any(f.source is Source.P2P for f in fields):
            self.p2p = P2PReader(self.session)

    def close(self, xid_grace_s: float | None = None) -> None:
        """Stop the XID thread, free the GPM samples and shut NVML down.

        ``xid_grace_s``: how long the XID thread gets to leave its wait (default: as
        long as it takes). If it is still waiting then, NVML is left for the process's
        exit to release: shutting it down under a thread inside a call is not safe.
        """
        ended = self.xid.close(xid_grace_s) if self.xid is not None else True
        for _, gpm in self._readers():
            gpm.close()
        if ended:
            self.session.close()
        else:
            log.debug("XID thread still in its wait; NVML is released at exit")

    def _ensure_open(self) -> None:
        """Initialise NVML once; DriverGone if it cannot be, or went away since."""
        if self.session.up:
            return
        if self._opened:
            raise DriverGone("NVML was shut down under the exporter")
        self.session.open()
        self._opened = True
        log.info("NVML initialised: driver %s", self.session.driver_version)

    def collect(self) -> Snapshot:
        """Run one cycle; raises :class:`DriverGone` when NVML is unusable as a whole."""
        start = self.clock()
        t0 = time.perf_counter()
        results: list[CollectorResult] = []
        problems: list[str] = []
        try:
            self._ensure_open()
            inv = self.enumerator.enumerate()
        except DriverGone:
            self.busy_with = ""
            raise
        results.append(CollectorResult("enumerate", True, time.perf_counter() - t0))
        self._forget_gone(inv)
        self._recheck_mig_changes(inv)
        self._inventory = inv
        self._warn_no_gpu(inv)

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
        members_of = self._members()
        try:
            for gpu in inv.gpus:
                until = self._quarantine.get(gpu.key, 0.0)
                if until > start:
                    down.append(gpu)
                    problems.append(fatal.aside(gpu, until - start))
                    continue
                g0 = time.perf_counter()
                members = members_of.get(gpu.key, [])
                try:
                    gpm_s = self._read_gpu(
                        gpu, gpu.key in inv.mig_enabled, members, start, wanted, values, procs
                    )
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
        finally:
            self.busy_with = ""
        results.append(CollectorResult("fields", True, t_fields))
        results.append(CollectorResult("gpm", True, t_gpm))

        xid_state = self._read_xids(inv.gpus, results)
        p2p = self._read_p2p(gpus_ok)
        live = {d.key for d in gpus_ok}
        entities = tuple(e for e in inv.entities() if (e.parent or e).key in live)
        self.session.summarize_unsupported()
        self._own = values
        self._last = snap = Snapshot(
            taken_at=start,
            duration=time.perf_counter() - t0,
            gpus=tuple(gpus_ok),
            entities=entities,
            down=tuple(down),
            values=self._merged(),
            xid=xid_state,
            p2p=p2p,
            processes=MappingProxyType(procs),
            collectors=tuple(results),
            problems=tuple(problems),
            stopped=tuple(k for k, t in self._quarantine.items() if t == math.inf),
        )
        for i, got in enumerate(self._group_values):
            if not got:  # not read since the collections were set: the first exposition
                snap = self.collect_group(i) or snap  # has every field, as DCGM's does
        return snap

    def collect_group(self, i: int) -> Snapshot | None:
        """Read group ``i``'s fields on the last cycle's devices: that snapshot with these
        values in place; None before the first cycle or while NVML is down."""
        last = self._last
        if last is None or not self.session.up:
            return None
        reader, gpm = self._group_readers[i]
        now = self.clock()
        members = self._members()
        got: dict[str, dict[str, Value]] = {}
        try:
            for gpu in last.gpus:
                if self._quarantine.get(gpu.key, 0.0) > now:
                    continue
                self.busy_with = f"GPU {gpu.index} ({gpu.uuid}), {self.groups[i].name}"
                try:
                    got[gpu.key] = reader.read(gpu, Scope.DEVICE)
                    for dev in members.get(gpu.key, [gpu]):
                        vals = got.setdefault(dev.key, {})
                        vals.update(reader.read(dev, Scope.INSTANCE))
                        vals.update(gpm.read(dev, now))
                except DeviceLost:
                    for dev in [gpu, *members.get(gpu.key, ())]:
                        got.pop(dev.key, None)  # the next cycle finds it lost
        except DriverGone:
            return None  # the next cycle re-initialises
        finally:
            self.busy_with = ""
        self._group_values[i] = got
        self._last = snap = replace(last, values=self._merged())
        return snap

    def _members(self) -> dict[str, list[Device]]:
        """GPU key -> the devices whose instance-level fields it carries."""
        inv = self._inventory
        out: dict[str, list[Device]] = {}
        for m in inv.instances:
            assert m.parent is not None
            out.setdefault(m.parent.key, []).append(m)
        return {
            g.key: [g] if g.key not in inv.mig_enabled else out.get(g.key, []) for g in inv.gpus
        }

    def _merged(self) -> Mapping[str, Mapping[str, Value]]:
        """The last cycle's own readings with each group's latest values in place."""
        values = self._own
        if any(self._group_values):
            values = {k: dict(v) for k, v in values.items()}
            for got in self._group_values:
                for key, vals in got.items():
                    if key in values:
                        values[key].update(vals)
        return MappingProxyType({k: MappingProxyType(v) for k, v in values.items()})

    def _read_gpu(
        self,
        gpu: Device,
        mig: bool,
        members: list[Device],
        start: float,
        wanted: Wanted | None,
        values: dict[str, dict[str, Value]],
        procs: dict[str, tuple[ProcUse, ...]],
    ) -> float:
        """Read one GPU (``mig``: in MIG mode) and its instances into ``values``/``procs``;
        returns GPM seconds."""
        self.busy_with = f"GPU {gpu.index} ({gpu.uuid})"
        values[gpu.key] = self.reader.read(gpu, Scope.DEVICE)
        values[gpu.key].update(self.fabric.read(gpu))
        p0 = time.perf_counter()
        if mig:  # its GPU-level GPM metrics, sampled on the GPU itself
            values[gpu.key].update(self.gpm.read(gpu, start, mig_gpu=True))
        gpm_s = time.perf_counter() - p0
        for dev in members:
            vals = values.setdefault(dev.key, {})
            vals.update(self.reader.read(dev, Scope.INSTANCE))
            p0 = time.perf_counter()
            vals.update(self.gpm.read(dev, start))
            gpm_s += time.perf_counter() - p0
            if wanted is not None and wanted(dev.key, vals):
                procs[dev.key] = self.processes.read(dev)
        return gpm_s

    def _read_xids(self, gpus: tuple[Device, ...], results: list[CollectorResult]) -> XidState:
        """The XID counters; a GPU with a fatal XID is set aside until the exporter restarts."""
        if self.xid is None:
            return XidState()
        x0 = time.perf_counter()
        err = ""
        try:
            self.xid.watch(gpus)
        except NvmlProblem as e:
            err = str(e)
        state = self.xid.state()
        fatal.stop(gpus, state, self._quarantine)
        ok = not err and self.xid.healthy
        results.append(CollectorResult("xid", ok, time.perf_counter() - x0, err))
        return state

    def _read_p2p(self, gpus: list[Device]) -> Mapping[str, tuple[P2PSeries, ...]]:
        """P2P status series by GPU key (read again only when the set of GPUs changes)."""
        if self.p2p is None:
            return MappingProxyType({})
        self.busy_with = "P2P status"
        by_index = self.p2p.read(gpus)
        self.busy_with = ""
        return MappingProxyType({g.key: by_index[g.index] for g in gpus if g.index in by_index})

    def _warn_no_gpu(self, inv: Inventory) -> None:
        """Say once when NVML sees no GPU at all: every GPU series is then absent."""
        if inv.gpus or inv.lost or self._said_no_gpu:
            return
        self._said_no_gpu = True
        log.warning(
            "NVML sees 0 GPUs: no GPU series are served; give the container the GPUs "
            "(NVIDIA_VISIBLE_DEVICES=all with the NVIDIA container runtime, or the node's "
            "/dev/nvidia* devices)"
        )

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
            for reader, gpm in self._readers():
                reader.forget(gone)
                gpm.forget(gone)
            self.fabric.forget(gone)

    def _recheck_mig_changes(self, inv: Inventory) -> None:
        """Fields a GPU lacked are asked for again when its MIG mode changed: NVML answers
        NOT_SUPPORTED for utilization, encoder and decoder on MIG-enabled GPUs only."""
        changed = inv.mig_enabled ^ self._inventory.mig_enabled
        for key in changed & {g.key for g in inv.gpus}:
            for reader, _ in self._readers():
                reader.recheck(key)


def _fields(catalog: Catalog, groups: tuple[Group, ...]) -> list[Field]:
    """What the collect-interval cycle reads (the catalog's fields and their inputs that
    no group reads), plus what accounting needs every cycle (energy, utilization, memory
    used) where the catalog does not list it."""
    listed = {f.name for f in with_inputs(m.field for m in catalog.metrics)}
    extra = [FIELDS[n] for n in ALWAYS_READ if n not in listed]
    return with_inputs([*default_fields(catalog, groups), *extra])
