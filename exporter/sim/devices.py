"""Run-time state of simulated GPUs and MIG devices, and the values they report.

Moving values are closed-form functions of sim time t (seconds since install):
utilization is base + swing * sin(2 pi t / period + phase), power follows it,
and cumulative counters (energy, PCIe and NVLink bytes, GPM activity) are the
exact integrals, so they are monotonic and cost a few float operations a call.
"""

from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass, field

import pynvml

from exporter.sim.fabricspec import FabricSpec
from exporter.sim.models import COMPUTE_SLICES, GpuModel
from exporter.sim.specs import GpuSpec, LoadSpec, MigSpec, ProcessSpec, memory_in_use_mib, mig_uuid

NA = 0xFFFFFFFF  # NVML's "no instance id" for gpuInstanceId / computeInstanceId
MiB = 1 << 20
SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeClock
)


class Wave:
    """base + amp * sin(omega t + phase), with its exact integral from 0."""

    __slots__ = ("_c0", "amp", "base", "omega", "period_s", "phase")

    def __init__(self, base: float, amp: float, period_s: float, phase: float) -> None:
        self.base, self.amp, self.period_s, self.phase = base, amp, period_s, phase
        self.omega = 2 * math.pi / period_s
        self._c0 = math.cos(phase)

    def at(self, t: float) -> float:
        if not self.amp:
            return self.base
        return self.base + self.amp * math.sin(self.omega * t + self.phase)

    def integral(self, t: float) -> float:
        if not self.amp:
            return self.base * t
        return self.base * t - self.amp / self.omega * (
            math.cos(self.omega * t + self.phase) - self._c0
        )


def phase_of(*parts: object) -> float:
    """A deterministic phase in [0, 2 pi) for a device."""
    h = 0
    for ch in "/".join(map(str, parts)):
        h = (h * 131 + ord(ch)) % 1_000_003
    return (h / 1_000_003) * 2 * math.pi


def in_use(mib: int, n: int) -> int:
    """Bytes in use: ``mib`` MiB and, where that is not 0, some 4 KiB pages more (under
    1 MiB, distinct per device number ``n``), so that bytes differ from MiB x 1 MiB."""
    return mib * MiB + 4096 * ((37 + 53 * n) % 256) if mib else 0


class Activity:
    """Utilization (percent) over time, from a load spec and the device's processes."""

    __slots__ = ("dec", "enc", "mem_ratio", "util")

    def __init__(self, load: LoadSpec, processes: tuple[ProcessSpec, ...], phase: float) -> None:
        base = load.util if load.util is not None else min(100.0, sum(p.sm_util for p in processes))
        swing = load.swing if load.swing is not None else min(10.0, base / 4)
        swing = min(swing, base, 100.0 - base)
        self.util = Wave(base, swing, load.period_s, phase)
        self.mem_ratio = (
            (load.mem_util / base) if (load.mem_util is not None and base > 0) else 0.55
        )
        self.enc = load.enc
        self.dec = load.dec

    def factor(self, t: float) -> float:
        """Current utilization relative to its base (1 when the base is 0)."""
        base = self.util.base
        return self.util.at(t) / base if base > 0 else 1.0


def new_handle() -> tuple[ctypes.c_uint64, bytes]:
    """A distinct, stable pointer value (and the buffer that keeps it alive)."""
    buf = ctypes.c_uint64(0)
    return buf, ctypes.addressof(buf).to_bytes(ctypes.sizeof(ctypes.c_void_p), sys.byteorder)


@dataclass(eq=False)
class Device:
    """What a GPU handle and a MIG handle have in common."""

    uuid: str
    name: str
    activity: Activity
    processes: tuple[ProcessSpec, ...]
    used_mib: int
    is_mig: bool = False
    stale: bool = False
    key: bytes = b""
    _buf: ctypes.c_uint64 | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._buf, self.key = new_handle()

    @property
    def gpu(self) -> GpuState:
        """The physical GPU (itself, or a MIG device's parent)."""
        raise NotImplementedError

    def memory(self, t: float = 0.0) -> tuple[int, int, int, int]:
        """(total, reserved, free, used) bytes at sim time ``t``."""
        raise NotImplementedError

    def process_rows(self, t: float = 0.0) -> list[tuple[ProcessSpec, int, int]]:
        """(process, GPU instance id, compute instance id) per process running at ``t``."""
        raise NotImplementedError

    def live(self, t: float) -> tuple[ProcessSpec, ...]:
        """This device's own processes running at sim time ``t`` (fleet ``start``/``end``)."""
        return tuple(p for p in self.processes if p.alive(t))

    def used_at(self, t: float) -> int:
        """MiB in use at ``t``: the processes running then (or the load's memory, if more)."""
        if all(p.start == 0 and p.end is None for p in self.processes):
            return self.used_mib
        return memory_in_use_mib(self.spec.load, self.processes, t)  # type: ignore[attr-defined]


@dataclass(eq=False, kw_only=True)
class MigState(Device):
    """One MIG device (GPU instance + compute instance) under a parent GPU."""

    parent: GpuState = field(repr=False)
    spec: MigSpec

    @property
    def gpu(self) -> GpuState:
        return self.parent

    @property
    def gi(self) -> int:
        return self.spec.gi

    @property
    def ci(self) -> int:
        return self.spec.ci

    @property
    def index(self) -> int:
        return self.spec.index

    def process_rows(self, t: float = 0.0) -> list[tuple[ProcessSpec, int, int]]:
        return [(p, self.spec.gi, self.spec.ci) for p in self.live(t)]

    def memory(self, t: float = 0.0) -> tuple[int, int, int, int]:
        """(total, reserved, free, used) bytes of this instance."""
        total = self.spec.profile.memory_mib * MiB
        used = in_use(self.used_at(t), self.spec.gi)
        return total, 0, total - used, used


@dataclass(eq=False, kw_only=True)
class GpuState(Device):
    """One physical GPU: identity, MIG layout, counters and injected faults."""

    spec: GpuSpec
    model: GpuModel
    index: int = 0
    migs: list[MigState] = field(default_factory=list)
    mig_enabled: bool = False
    mig_generation: int = 0
    power: Wave = field(init=False)  # set by build(), once the MIG layout is known
    energy_offset_mj: float = 0.0
    ecc_volatile: list[int] = field(default_factory=lambda: [0, 0])  # [corrected, uncorrected]
    ecc_aggregate: list[int] = field(default_factory=lambda: [0, 0])
    remapped: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # cor, unc, pending, failure
    retired_pages: list[tuple[int, int, int]] = field(default_factory=list)  # address, us, cause
    retired_pending: int = 0
    lost: bool = False
    unsupported_functions: set[str] = field(default_factory=set)
    unsupported_fields: set[int] = field(default_factory=set)
    overheats: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, C
    fabric: FabricSpec | None = None  # what nvmlDeviceGetGpuFabricInfo reports; None: no fabric

    @property
    def gpu(self) -> GpuState:
        return self

    @classmethod
    def build(cls, spec: GpuSpec) -> GpuState:
        model = spec.model
        gpu = cls(
            uuid=spec.uuid,
            name=model.name,
            activity=Activity(spec.load, spec.processes, phase_of(spec.uuid)),
            processes=spec.processes,
            used_mib=memory_in_use_mib(spec.load, spec.processes),
            spec=spec,
            model=model,
            index=spec.index,
            fabric=spec.fabric,
        )
        gpu._apply_layout(spec.mig)
        if spec.mig is not None and spec.load.util is None:
            base = (
                sum(m.activity.util.base * m.spec.profile.slices for m in gpu.migs) / COMPUTE_SLICES
            )
            gpu.activity = Activity(
                LoadSpec(util=base, swing=spec.load.swing, period_s=spec.load.period_s),
                (),
                phase_of(spec.uuid),
            )
        gpu.power = gpu._power_wave(spec.load)
        # Energy counts from driver load, which was well before the sim started.
        gpu.energy_offset_mj = 3_600_000.0 * model.power["idle"] * (1 + spec.index % 3)
        return gpu

    def _power_wave(self, load: LoadSpec) -> Wave:
        limit = self.model.power["limit"] * 1000.0
        idle = self.model.power["idle"] * 1000.0
        u = self.activity.util
        if load.power is not None:
            base = max(idle, load.power * limit)
        else:
            base = idle + (limit - idle) * 0.85 * u.base / 100.0
        amp = (limit - idle) * 0.85 * u.amp / 100.0
        amp = min(amp, base - idle * 0.9, limit - base)
        return Wave(base, max(amp, 0.0), u.period_s, u.phase)

    def reconfigure(self, layout: tuple[MigSpec, ...] | None) -> list[MigState]:
        """Replace the MIG layout; returns the MIG devices that went away (now stale)."""
        gone = self.migs
        for m in gone:
            m.stale = True
        self.mig_generation += 1
        self._apply_layout(layout)
        return gone

    def _apply_layout(self, layout: tuple[MigSpec, ...] | None) -> None:
        self.mig_enabled = layout is not None
        self.migs = []
        for s in layout or ():
            self.migs.append(
                MigState(
                    uuid=s.uuid or mig_uuid(self.uuid, s.gi, s.ci, self.mig_generation),
                    name=f"{self.model.name} MIG {s.profile.name}",
                    activity=Activity(
                        s.load, s.processes, phase_of(self.uuid, s.gi, self.mig_generation)
                    ),
                    processes=s.processes,
                    used_mib=memory_in_use_mib(s.load, s.processes),
                    is_mig=True,
                    parent=self,
                    spec=s,
                )
            )
        self.used_mib = (
            sum(m.used_mib for m in self.migs)
            if self.mig_enabled
            else memory_in_use_mib(self.spec.load, self.processes)
        )

    def mig_by_gi(self, gi: int) -> MigState | None:
        for m in self.migs:
            if m.spec.gi == gi:
                return m
        return None

    # ---- values -------------------------------------------------------------

    def util(self, t: float) -> float:
        return self.activity.util.at(t)

    def power_mw(self, t: float) -> float:
        return self.power.at(t)

    def energy_mj(self, t: float) -> float:
        return self.energy_offset_mj + self.power.integral(t)

    def overheat_c(self, t: float) -> float | None:
        for start, end, temp in self.overheats:
            if start <= t < end:
                return temp
        return None

    def temperature_c(self, t: float) -> int:
        hot = self.overheat_c(t)
        if hot is not None:
            return round(hot)
        temp, power = self.model.temperature, self.model.power
        frac = (self.power_mw(t) / 1000.0 - power["idle"]) / (power["limit"] - power["idle"])
        return round(temp["idle"] + (temp["load"] - temp["idle"]) * max(frac, 0.0))

    def memory_temperature_c(self, t: float) -> int:
        return self.temperature_c(t) + self.model.temperature["memory_offset"]

    def thermal_violation_ns(self, t: float) -> int:
        total = 0.0
        for start, end, _ in self.overheats:
            if t > start:
                total += min(t, end) - start
        return int(total * 1e9)

    def power_violation_ns(self, t: float) -> int:
        frac = self.power.base / (self.model.power["limit"] * 1000.0)
        return int(max(0.0, min(1.0, (frac - 0.9) / 0.1)) * t * 1e9)

    def low_util_violation_ns(self, t: float) -> int:
        return int(t * 1e9) if self.activity.util.base < 5 else 0

    def sm_clock(self, t: float) -> int:
        clocks = self.model.clocks
        if self.overheat_c(t) is not None:
            return round(clocks["sm_max"] * 0.6)
        u = self.util(t)
        if u < 1:
            return clocks["sm_idle"]
        return round(clocks["sm_max"] * (0.85 + 0.15 * u / 100.0))

    def clock_mhz(self, clock: int, t: float) -> int | None:
        clocks = self.model.clocks
        if clock == pynvml.NVML_CLOCK_SM:
            return self.sm_clock(t)
        if clock == pynvml.NVML_CLOCK_GRAPHICS:  # a step or so below SM, told apart from it
            return round(clocks["graphics_max"] * self.sm_clock(t) / clocks["sm_max"])
        if clock == pynvml.NVML_CLOCK_MEM:
            return clocks["mem_max"]
        if clock == pynvml.NVML_CLOCK_VIDEO:
            return round(clocks["video_max"] * self.sm_clock(t) / clocks["sm_max"])
        return None

    def clocks_event_reasons(self, t: float) -> int:
        temp = self.overheat_c(t)
        if temp is not None:
            reasons = pynvml.nvmlClocksEventReasonSwThermalSlowdown
            if temp >= self.model.temperature["slowdown"]:
                reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
            return reasons
        if self.util(t) < 1:
            return pynvml.nvmlClocksEventReasonGpuIdle
        if self.power_mw(t) >= 0.95 * self.model.power["limit"] * 1000.0:
            return pynvml.nvmlClocksEventReasonSwPowerCap
        return pynvml.nvmlClocksEventReasonNone

    def pstate(self, t: float) -> int:
        return (
            pynvml.NVML_PSTATE_0
            if (self.mig_enabled or self.util(t) >= 1)
            else pynvml.NVML_PSTATE_8
        )

    def fan_percent(self, t: float) -> int:
        idle = self.model.temperature["idle"]
        return max(30, min(100, round(30 + (self.temperature_c(t) - idle) * 1.5)))

    def pcie_rate(self, t: float, rx: bool) -> float:
        """PCIe bytes/s now."""
        return self.model.traffic["pcie_rx" if rx else "pcie_tx"] * MiB * self.util(t) / 100.0

    def pcie_bytes(self, t: float, rx: bool) -> int:
        """PCIe bytes since driver load."""
        rate = self.model.traffic["pcie_rx" if rx else "pcie_tx"] * MiB
        return int(rate * (3600.0 + self.activity.util.integral(t) / 100.0))

    def nvlink_kib(self, t: float, rx: bool, link: int | None) -> int:
        """NVLink data KiB since driver load, on one link or (None) all of them."""
        total_kib_s = self.model.traffic["nvlink_rx" if rx else "nvlink_tx"] * 1024
        kib = total_kib_s * (3600.0 + self.activity.util.integral(t) / 100.0)
        return int(kib if link is None else kib / self.model.nvlinks)

    def used_at(self, t: float) -> int:
        if self.mig_enabled:
            return sum(m.used_at(t) for m in self.migs)
        return super().used_at(t)

    def memory(self, t: float = 0.0) -> tuple[int, int, int, int]:
        """(total, reserved, free, used) bytes, with used excluding reserved (nvmlMemory_v2)."""
        total = self.model.memory_mib * MiB
        reserved = self.model.memory_reserved_mib * MiB
        used = self.used_at(t) * MiB if self.mig_enabled else in_use(self.used_at(t), self.index)
        return total, reserved, total - reserved - used, used

    def process_rows(self, t: float = 0.0) -> list[tuple[ProcessSpec, int, int]]:
        if self.mig_enabled:
            return [row for m in self.migs for row in m.process_rows(t)]
        return [(p, NA, NA) for p in self.live(t)]

    def supported_events(self) -> int:
        extra = pynvml.nvmlEventMigConfigChange if self.model.mig_capable else 0
        return SUPPORTED_EVENTS | extra
