"""Per-process GPU memory and SM utilization, read only for devices shared by several pods.

Memory comes from the running-process lists (exporter/nvml/proclist.py): compute
processes and the clients of an MPS server, which NVML lists apart. On MIG
instances NVML gives no per-process memory (NVML_VALUE_NOT_AVAILABLE): their
processes are listed without it. SM utilization comes from NVML's per-process
samples since the previous cycle (whole GPUs only: NVML has none for MIG
instances). PIDs are host PIDs; workloads/cgroups.py joins them to containers after the cycle.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import MIB
from exporter.nvml.proclist import Proc, ProcessLists
from exporter.nvml.session import CallFailed, Session, Unavailable

log = logging.getLogger(__name__)

_NO_SAMPLES = {N.NVML_ERROR_NOT_FOUND, N.NVML_SUCCESS}  # NVMLError(0): a known pynvml quirk


@dataclass(frozen=True, slots=True)
class ProcUse:
    """One process on one device: memory in MiB (None if NVML withholds it, as on MIG; 0
    for a process only the utilization samples show, such as a graphics one), SM % (None:
    no sample)."""

    pid: int
    used_mib: float | None
    sm_util: float | None


class ProcessReader:
    """Reads process lists and utilization samples; remembers the last sample time per device."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lists = ProcessLists(session)
        self._last_seen: dict[str, int] = {}
        self._said_mig = False

    def read(self, dev: Device) -> tuple[ProcUse, ...]:
        """Processes on ``dev``; DeviceLost/DriverGone propagate, anything else yields ()."""
        try:
            procs = self.lists.read(dev)
        except (Unavailable, CallFailed):
            return ()
        with contextlib.suppress(Unavailable, CallFailed):  # no MPS here (before Volta)
            procs += self.lists.read(dev, "MPSCompute")
        memory: dict[int, float | None] = {}
        for p in procs:
            used = None if p.used_bytes is None else p.used_bytes / MIB
            prev = memory.get(p.pid)
            memory[p.pid] = used if prev is None else prev + (used or 0)
        if dev.is_mig and procs:
            self._say_mig(procs)
        sm = {} if dev.is_mig else self._utilization(dev)
        live = set(memory) | set(sm)
        return tuple(
            ProcUse(
                pid,
                memory.get(pid, 0.0),  # None stays None: withheld
                sm.get(pid, 0.0 if pid in memory else None),
            )
            for pid in sorted(live)
        )

    def _say_mig(self, procs: list[Proc]) -> None:
        """Say once what a shared MIG instance's attribution can and cannot do."""
        if not self._said_mig and any(p.used_bytes is None for p in procs):
            self._said_mig = True
            log.info(
                "per-process memory is not available on MIG instances (NVML gives none): "
                "containers sharing one get no framebuffer series of their own; its "
                "processes are still joined to their containers"
            )

    def _utilization(self, dev: Device) -> dict[int, float]:
        last = self._last_seen.get(dev.key, 0)
        try:
            samples = self.session.run(
                "nvmlDeviceGetProcessUtilization", dev.handle, last, empty=_NO_SAMPLES
            )
        except (Unavailable, CallFailed):
            return {}
        if samples is None:
            return {}
        per_pid: dict[int, list[int]] = {}
        newest = last
        for s in samples:
            if s.timeStamp > last:
                per_pid.setdefault(s.pid, []).append(s.smUtil)
                newest = max(newest, s.timeStamp)
        self._last_seen[dev.key] = newest
        return {pid: sum(v) / len(v) for pid, v in per_pid.items()}
