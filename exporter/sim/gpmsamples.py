"""The driver's GPM sample buffers: what each recorded (the GPM functions: exporter/sim/gpm.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.sim.devices import Device


@dataclass(eq=False)
class Sample:
    """One GPM sample buffer: sim time and cumulative activity of one device."""

    key: bytes
    buf: Any
    device: Device | None = None
    t: float = 0.0
    util_s: float = 0.0  # integral of utilization, percent * s
    mem_ratio: float = 0.0
    pcie: tuple[float, float] = (0.0, 0.0)  # tx, rx bytes
    nvlink: tuple[float, float] = (0.0, 0.0)  # tx, rx bytes, all links
    links: int = 0
    dec: float = 0.0  # video decoder busy, percent
    engines: tuple[int, int, int] = (0, 0, 0)  # NVDEC, NVJPG, NVOFA engines of the device


class GpmSamples:
    """The allocated samples of a driver, by handle."""

    def __init__(self) -> None:
        self.samples: dict[bytes, Sample] = {}
