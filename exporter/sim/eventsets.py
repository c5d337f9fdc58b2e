"""The driver's NVML event sets and the events queued on them (use with the driver lock held).

An event reaches a set when the set registered the event's GPU for its type
before the event happened; the C functions that use the sets are in
exporter/sim/events.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from exporter.sim.devices import NA, GpuState, new_handle

MAX_QUEUED = 1024  # per set; the oldest events are dropped beyond this


@dataclass(frozen=True)
class Event:
    """One event as a set queues it: its GPU, NVML event type and data, sim time, MIG ids."""

    gpu: GpuState
    type: int
    data: int
    at: float
    gi: int
    ci: int


@dataclass(eq=False)
class EventSet:
    """One nvmlEventSet_t: the GPUs registered on it, its queue, whether it was freed."""

    key: bytes
    buf: Any
    registered: dict[int, tuple[int, float]] = field(default_factory=dict)  # gpu -> mask, since
    queue: deque[Event] = field(default_factory=lambda: deque(maxlen=MAX_QUEUED))
    freed: bool = False


class EventHub:
    """All event sets of a driver (use with the driver lock held)."""

    def __init__(self) -> None:
        self.sets: dict[bytes, EventSet] = {}

    def create(self) -> EventSet:
        buf, key = new_handle()
        es = EventSet(key, buf)
        self.sets[key] = es
        return es

    def publish(
        self,
        gpu: GpuState,
        type_: int,
        data: int,
        at: float,
        gi: int | None = None,
        ci: int | None = None,
    ) -> None:
        event = Event(gpu, type_, data, at, NA if gi is None else gi, NA if ci is None else ci)
        for es in self.sets.values():
            mask, since = es.registered.get(gpu.index, (0, math.inf))
            if mask & type_ and at >= since:
                es.queue.append(event)
