"""SimDriver: the simulated node at run time (time, devices, handles, faults), and install()."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pynvml

from exporter.sim import pods
from exporter.sim.clock import ManualClock
from exporter.sim.devices import Device, GpuState
from exporter.sim.driverview import ModuleState
from exporter.sim.eventsets import EventHub
from exporter.sim.faultkinds import KINDS
from exporter.sim.faults import Fault
from exporter.sim.fleet import Fleet, coerce
from exporter.sim.gpmsamples import GpmSamples
from exporter.sim.kmsg import KernelLog
from exporter.sim.library import SimLibrary

_INF = math.inf


class SimDriver:
    """A simulated NVML driver for one fleet; installed as pynvml.nvmlLib by install().

    Sim time is seconds since the driver was created, read from `clock`.
    Attributes for tests: fleet (the immutable spec), gpus (run-time GpuState
    per index, with .migs), library (the SimLibrary), clock.
    """

    def __init__(
        self,
        fleet: Fleet,
        clock: Callable[[], float] | None = None,
        latency: bool | None = None,
        kernel_log: str | Path | None = None,
    ) -> None:
        self.fleet = fleet
        self.clock = clock or time.monotonic
        self._t0 = self.clock()
        self._epoch0 = time.time()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.latency = fleet.latency
        if latency is not None:
            self.latency = dataclasses.replace(fleet.latency, enabled=latency)
        self.gpus = [GpuState.build(spec) for spec in fleet.gpus]
        self.handles: dict[bytes, Device] = {}
        for gpu in self.gpus:
            self.register(gpu)
        self.init_count = 0  # this process's nvmlInit calls not yet shut down
        self.module = ModuleState(fleet.driver_version, fleet.driver_version)
        self.kernel_log = KernelLog(kernel_log) if kernel_log is not None else None
        self.slow_rules: dict[str, list[tuple[int | None, float, float, float]]] = {}
        self.unsupported_functions: set[str] = set()  # node-wide not_supported faults
        self.events = EventHub()
        self.gpm = GpmSamples()
        self.closed = False
        self._pending: list[tuple[float, int, Fault]] = []
        self._seq = itertools.count()
        self.next_fault_at = _INF
        for fault in fleet.faults:
            self._schedule(fault, fault.at or 0.0)
        self.library = SimLibrary(self)
        if isinstance(self.clock, ManualClock):
            self.clock.subscribe(self._on_clock)

    # ---- time ---------------------------------------------------------------

    def now(self) -> float:
        """Sim time in seconds."""
        return self.clock() - self._t0

    def pods(self, t: float | None = None) -> list[dict[str, Any]]:
        """The fleet's pods running at sim time ``t`` (default now), as pod-resources
        ``List`` entries with the devices' current IDs (exporter/sim/pods.py)."""
        with self.lock:
            now = self.now() if t is None else t
            return pods.running(self.fleet.pods, self.gpus, now, self.fleet.hostname)

    def epoch_us(self, t: float) -> int:
        """Sim time t as wall-clock microseconds (NVML timestamps)."""
        return int((self._epoch0 + t) * 1e6)

    def advance(self, seconds: float) -> None:
        """Move a ManualClock forward and let due faults and events happen."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs install(clock=ManualClock())")
        self.clock.advance(seconds)

    def _on_clock(self) -> None:
        """Apply the faults the new time makes due; that alone wakes event waiters (a real
        driver does not wake a waiting thread because time passed)."""
        with self.lock:
            now = self.now()
            if now >= self.next_fault_at:
                self.apply_due(now)

    # ---- latency --------------------------------------------------------------

    def set_latency(self, enabled: bool) -> None:
        """Turn the per-call cost model on or off."""
        self.latency = dataclasses.replace(self.latency, enabled=enabled)
        self.library.rebuild()
        pynvml._nvmlGetFunctionPointer_cache.clear()

    # ---- faults -------------------------------------------------------------

    def inject(self, fault: Fault) -> Fault:
        """Schedule a fault (at=None: now); raises FleetError if it does not fit the fleet."""
        fault = self.fleet.parse_fault(fault)
        with self.lock:
            now = self.now()
            self._schedule(fault, now if fault.at is None else fault.at)
            if now >= self.next_fault_at:
                self.apply_due(now)
            self.cond.notify_all()
        return fault

    def _schedule(self, fault: Fault, at: float) -> None:
        heapq.heappush(self._pending, (at, next(self._seq), dataclasses.replace(fault, at=at)))
        self.next_fault_at = self._pending[0][0]

    def apply_due(self, now: float) -> None:
        """Apply every fault due by `now` (call with the lock held)."""
        while self._pending and self._pending[0][0] <= now:
            _, _, fault = heapq.heappop(self._pending)
            self._apply(fault)
        self.next_fault_at = self._pending[0][0] if self._pending else _INF
        self.cond.notify_all()

    def _apply(self, f: Fault) -> None:
        gpu = self.gpus[f.gpu] if f.gpu is not None else None
        KINDS[f.kind].apply(self, f, gpu)

    def slow_seconds(self, name: str, gpu: int | None, now: float) -> float:
        """Blocking time a `slow` fault adds to this call now (0 when none)."""
        delay = 0.0
        for target, seconds, start, end in self.slow_rules.get(name, ()):
            if (target is None or target == gpu) and start <= now < end:
                delay = max(delay, seconds)
        return delay

    # ---- handles ------------------------------------------------------------

    def register(self, dev: Device) -> None:
        """Make a device's handle (and its MIG devices') known to the library."""
        self.handles[dev.key] = dev
        for mig in getattr(dev, "migs", ()):
            self.handles[mig.key] = mig

    # ---- the kernel module and this process's library --------------------------

    def node_error(self, now: float) -> int:
        """The code every call returns now (driver not loaded, library and module of
        different versions, not initialised), or SUCCESS (lock held)."""
        module = self.module
        if module.loaded is None:
            if now < module.load_at:
                return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
            module.loaded, module.load_at = module.installed, _INF
        if module.process is not None and module.process != module.loaded:
            return pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        if not self.init_count:
            return pynvml.NVML_ERROR_UNINITIALIZED
        return pynvml.NVML_SUCCESS

    def versions(self) -> tuple[str, str]:
        """(driver version, NVML version) that nvmlSystemGet*Version report now."""
        version = self.module.loaded or self.module.installed
        if version == self.fleet.driver_version:
            return version, self.fleet.nvml_version
        return version, f"{self.fleet.cuda_driver_version // 1000}.{version}"

    def unload(self, now: float, duration: float) -> None:
        """rmmod, then modprobe of the installed driver after ``duration`` s: refused while
        NVML is initialised (the module is in use), and done when the last client shuts
        NVML down (lock held)."""
        module = self.module
        if self.init_count:
            module.refused_unloads += 1
            module.pending_unload = duration
            return
        module.loaded, module.load_at, module.pending_unload = None, now + duration, None
        for es in self.events.sets.values():  # a new module knows no old event set
            es.freed = True
        self.events.sets.clear()
        self.cond.notify_all()

    def released(self, now: float) -> None:
        """NVML's last client let go: a waiting unload happens now (lock held)."""
        pending = self.module.pending_unload
        if not self.init_count and pending is not None:
            self.unload(now, pending)

    def restart_process(self) -> SimLibrary:
        """The process using NVML exits and a new one starts (a container restart): the
        old one's NVML holds go, the new one loads the library installed now."""
        with self.lock:
            self.init_count = 0
            self.released(self.now())
            self.module.process = None
            self.library = SimLibrary(self)
        with pynvml.libLoadLock:
            pynvml.nvmlLib = self.library
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlLib_refcount = 0
        return self.library

    def close(self) -> None:
        """Stop: wake event waiters and detach from the clock."""
        with self.lock:
            self.closed = True
            self.init_count = 0
            self.cond.notify_all()
        if isinstance(self.clock, ManualClock):
            self.clock.unsubscribe(self._on_clock)


_current: SimDriver | None = None


def install(
    fleet: Fleet | str | Path | Mapping[str, Any] | None = None,
    *,
    clock: Callable[[], float] | None = None,
    latency: bool | None = None,
    kernel_log: str | Path | None = None,
) -> SimDriver:
    """Make pynvml talk to a simulated driver; returns it. Replaces any earlier install.

    fleet: a Fleet, a fleet file path, a mapping shaped like one, or None for
    fleets/default.yaml. clock: zero-argument seconds (default time.monotonic);
    sim time 0 is now. latency: override the fleet's latency.enabled. kernel_log: a
    file the driver appends its kernel messages to, as /dev/kmsg records (XIDs).
    """
    global _current
    driver = SimDriver(coerce(fleet), clock=clock, latency=latency, kernel_log=kernel_log)
    uninstall()
    with pynvml.libLoadLock:
        pynvml.nvmlLib = driver.library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    _current = driver
    return driver


def uninstall() -> None:
    """Detach the simulation: pynvml loads the real library again on the next nvmlInit."""
    global _current
    with pynvml.libLoadLock:
        if isinstance(pynvml.nvmlLib, SimLibrary):
            pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    if _current is not None:
        _current.close()
        _current = None


def current() -> SimDriver | None:
    """The installed driver, if any."""
    return _current
