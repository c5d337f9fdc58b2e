"""Who held each device in one cycle: the plain records pod attribution hands to accounting.

workloads/usage.py builds them from the kubelet's map and the cycle's process rows; without
Kubernetes there are none, and each device is its own holder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.frame import Unaccounted
from exporter.nvml.devices import Device


@dataclass(frozen=True, slots=True)
class Claim:
    """One container's hold on one device (whole GPU or MIG instance) in a cycle.

    ``share`` is its part of the device: 1 when it holds it alone; on a time-sliced or
    MPS device its replicas over the replicas all holders hold. ``sm_percent`` is the SM
    utilization of its processes (percent of the whole GPU; shared whole GPUs whose
    processes were joined to pods, else None). ``running`` says whether it had a process
    on the device (None: not known).
    """

    namespace: str
    pod: str
    container: str
    share: float = 1.0
    sm_percent: float | None = None
    running: bool | None = None


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One device's holders in a cycle, and what ran on it that no holder accounts for.

    ``unaccounted_bytes`` and ``unaccounted_processes``: GPU memory (bytes) and number of
    processes that belong to no running container holding the device (a dead pod's
    leftovers, a process outside Kubernetes; every process of a device no one holds).
    ``unattributed_sm_percent``: SM utilization of processes on a shared whole GPU that
    could not be joined to one of its holders.
    """

    claims: tuple[Claim, ...] = ()
    unaccounted_bytes: float = 0.0
    unaccounted_processes: int = 0
    unattributed_sm_percent: float = 0.0


def unaccounted(
    uses: Mapping[str, DeviceUse] | None, devices: Iterable[Device]
) -> tuple[Unaccounted, ...] | None:
    """The devices among ``devices`` with unaccounted processes, in their order; None
    without pod attribution (``uses`` None)."""
    if uses is None:
        return None
    out = []
    for dev in devices:
        use = uses.get(dev.key)
        if use is not None and use.unaccounted_processes:
            out.append(
                Unaccounted(dev, bool(use.claims), use.unaccounted_bytes, use.unaccounted_processes)
            )
    return tuple(out)
