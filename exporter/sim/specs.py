"""The parts of a loaded fleet: GPUs, MIG devices, load, processes; default identities.

All immutable; exporter/sim/fleet.py builds them from a fleet file, the
driver keeps run-time state separately (exporter/sim/devices.py).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from exporter.sim.fabricspec import FabricSpec
from exporter.sim.models import GpuModel, MigProfile

_NAMESPACE = uuid.UUID("6d1c3f0e-5a1b-4c7e-9b8a-2f4e5d6c7b8a")
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class ProcessSpec:
    """A process using a GPU or MIG instance; memory in MiB, utilization in percent."""

    pid: int
    used_memory_mib: int
    sm_util: float
    mem_util: float
    type: str  # "compute", "graphics" or "mps" (a client of the MPS server)
    start: float = 0.0  # sim seconds it appears at
    end: float | None = None  # sim seconds it exits at (None: runs on)

    def alive(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True)
class LoadSpec:
    """Baseline activity. Values move as base + swing * sin(2 pi t / period_s + phase)."""

    util: float | None = None  # percent; None: the processes' sm_util summed
    mem_util: float | None = None  # percent of memory bandwidth; None: 55 % of util
    mem_used_mib: int | None = None  # None: the processes' memory summed
    power: float | None = None  # fraction of the power limit; None: from util
    swing: float | None = None  # percent points; None: a quarter of util, at most 10
    period_s: float = 120.0
    enc: float = 0.0
    dec: float = 0.0


@dataclass(frozen=True)
class MigSpec:
    """One MIG device (a GPU instance with one compute instance), placed."""

    profile: MigProfile
    gi: int
    ci: int
    start: int  # first memory slice
    index: int  # MIG device index under the parent
    uuid: str | None
    load: LoadSpec
    processes: tuple[ProcessSpec, ...]


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: GpuModel
    uuid: str
    pci_bus_id: str
    serial: str
    load: LoadSpec
    processes: tuple[ProcessSpec, ...]
    mig: tuple[MigSpec, ...] | None  # None: MIG disabled
    fabric: FabricSpec | None = None  # None: the board has no NVLink fabric
    ecc_enabled: bool = True  # ECC mode, on boards that have ECC


def digest(*parts: object) -> bytes:
    """SHA-256 of the parts joined by slashes (seeds default serials)."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def default_uuid(hostname: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{hostname}/gpu/{index}')}"


def mig_uuid(gpu_uuid: str, gi: int, ci: int, generation: int) -> str:
    """MIG UUIDs as drivers >= R470 print them; a new one each time a layout is created."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu_uuid}/{gi}/{ci}/{generation}')}"


def default_bus_id(index: int) -> str:
    return f"{index // len(_DGX_BUSES):08X}:{_DGX_BUSES[index % len(_DGX_BUSES)]:02X}:00.0"


def memory_in_use_mib(
    load: LoadSpec, processes: tuple[ProcessSpec, ...], t: float | None = None
) -> int:
    """Memory in use on a device: its processes' memory (those alive at ``t``, all when
    None), or load.mem_used_mib if more."""
    total = sum(p.used_memory_mib for p in processes if t is None or p.alive(t))
    return max(total, load.mem_used_mib or 0)
