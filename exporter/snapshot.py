"""The immutable result of one collection cycle, which everything downstream reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.nvml.devices import Device
from exporter.nvml.p2p import P2PSeries
from exporter.nvml.processes import ProcUse
from exporter.nvml.xid.events import XidState

Value = int | float


@dataclass(frozen=True, slots=True)
class CollectorResult:
    """Outcome of one part of a cycle (enumerate, fields, gpm, xid): success and seconds."""

    name: str
    success: bool
    duration: float
    error: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One cycle's readings. ``values`` maps a device key to its field values."""

    taken_at: float  # unix time the cycle started
    duration: float  # seconds the cycle took
    gpus: tuple[Device, ...] = ()  # physical GPUs that answered
    entities: tuple[Device, ...] = ()  # whole GPUs and MIG instances (instance-level series)
    down: tuple[Device, ...] = ()  # GPUs seen before that are lost or quarantined now
    values: Mapping[str, Mapping[str, Value]] = field(default_factory=lambda: MappingProxyType({}))
    xid: XidState = field(default_factory=XidState)
    p2p: Mapping[str, tuple[P2PSeries, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )  # NVLink P2P status per GPU key and peer, when DCGM_EXP_P2P_STATUS is enabled
    processes: Mapping[str, tuple[ProcUse, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )  # raw rows per device key, only for devices shared by several containers
    collectors: tuple[CollectorResult, ...] = ()
    problems: tuple[str, ...] = ()  # human-readable, shown by /ready
    stopped: tuple[str, ...] = ()  # keys of GPUs not called since a fatal XID (119)

    @property
    def ok(self) -> bool:
        return all(c.success for c in self.collectors)
