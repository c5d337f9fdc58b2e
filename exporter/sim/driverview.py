"""What the NVML functions, the library's wrappers and the fault kinds need of the driver.

They are given the running SimDriver (exporter/sim/driver.py) but see it through
DriverView, so none of them imports the driver module. Call the methods and
touch the state with the driver lock held unless a method says otherwise.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter.sim.devices import Device, GpuState
from exporter.sim.eventsets import EventHub
from exporter.sim.gpmsamples import GpmSamples
from exporter.sim.kmsg import KernelLog
from exporter.sim.latency import LatencySpec


@dataclass
class ModuleState:
    """The kernel module and the user-space library: versions and a pending unload."""

    installed: str  # the driver on disk: what a process starting now loads
    loaded: str | None = None  # the kernel module's version; None while unloaded
    process: str | None = None  # the library this process loaded at its first nvmlInit
    load_at: float = math.inf  # when an unloaded module is loaded again
    pending_unload: float | None = None  # an unload waiting for NVML's clients (its duration)
    refused_unloads: int = 0  # rmmod attempts refused because NVML was in use


class FleetFacts(Protocol):
    """The fleet's node-wide facts the driver's parts read (exporter/sim/fleet.py's Fleet)."""

    @property
    def source(self) -> str: ...
    @property
    def driver_version(self) -> str: ...
    @property
    def cuda_driver_version(self) -> int: ...
    @property
    def missing_functions(self) -> frozenset[str]: ...
    @property
    def mig_monitor(self) -> bool: ...


class DriverView(Protocol):
    """The running simulated driver: time, devices and handles, module, faults, events."""

    lock: threading.Lock
    cond: threading.Condition  # on `lock`: event waiters, notified on every change
    clock: Callable[[], float]  # the clock sim time is read from (a ManualClock in tests)
    latency: LatencySpec
    closed: bool  # the simulation was stopped: init fails
    init_count: int  # this process's nvmlInit calls not yet shut down
    module: ModuleState
    gpus: list[GpuState]  # by index
    handles: dict[bytes, Device]  # a handle's bytes -> its GPU or MIG device
    events: EventHub
    gpm: GpmSamples
    kernel_log: KernelLog | None  # where XIDs are written as /dev/kmsg records, if anywhere
    next_fault_at: float  # sim time of the next scheduled fault (inf: none)
    slow_rules: dict[str, list[tuple[int | None, float, float, float]]]  # slow faults by function
    unsupported_functions: set[str]  # node-wide not_supported faults

    @property
    def fleet(self) -> FleetFacts: ...

    def now(self) -> float:
        """Sim time in seconds."""
        ...

    def epoch_us(self, t: float) -> int:
        """Sim time t as wall-clock microseconds (NVML timestamps)."""
        ...

    def apply_due(self, now: float) -> None:
        """Apply every fault due by `now`."""
        ...

    def slow_seconds(self, name: str, gpu: int | None, now: float) -> float:
        """Blocking time a `slow` fault adds to this call now (0 when none)."""
        ...

    def register(self, dev: Device) -> None:
        """Make a device's handle (and its MIG devices') known to the library."""
        ...

    def node_error(self, now: float) -> int:
        """The code every call returns now, or NVML_SUCCESS."""
        ...

    def versions(self) -> tuple[str, str]:
        """(driver version, NVML version) reported now."""
        ...

    def unload(self, now: float, duration: float) -> None:
        """rmmod, and modprobe of the installed driver ``duration`` s later."""
        ...

    def released(self, now: float) -> None:
        """NVML's last client let go: a waiting unload happens now."""
        ...
