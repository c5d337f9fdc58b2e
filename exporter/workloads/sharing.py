"""Per-container shares of devices held by several containers (time-slicing, MPS).

Device series of a shared GPU keep no pod labels (one value copied to every
pod would be a lie), unless ``--kubernetes-virtual-gpus`` asks for dcgm-exporter's
copies (exposition/virtual.py, which also uses these shares). What can be
split honestly is split: framebuffer used,
from each process's memory, and SM utilization, from per-process samples,
summed per container. Every container that holds the device gets a share, at
0 when it runs nothing; memory of processes that cannot be joined to a holder
goes to an owner with empty names, so the parts still add up.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.frame import Owner, Split
from exporter.snapshot import Snapshot
from exporter.workloads.mapper import PodMap

UNATTRIBUTED = Owner("", "", "")


def split_shared(
    snap: Snapshot, podmap: PodMap, owner_of: Callable[[int], Owner | None] | None
) -> list[Split]:
    """Shares of each shared device of ``snap``, ordered by device key.

    ``owner_of`` maps a host PID to the holder it belongs to, or is None when
    processes cannot be joined to pods (no API server).
    """
    by_key = {d.key: d for d in snap.entities}
    out = []
    for key in sorted(podmap.shared):
        dev = by_key.get(key)
        if dev is None:
            continue
        holders = podmap.owners[key]
        read = key in snap.processes  # not read in a cycle before the device was known shared
        procs = snap.processes.get(key, ())
        joined = [owner_of(p.pid) if owner_of else None for p in procs]
        mem: dict[Owner, float] = {}
        sm: dict[Owner, float] = {}
        # Holders get shares (0 when idle) only where the join works for this device: a
        # device where no process could be joined (no host PIDs, say) shows the total only.
        if owner_of is not None and read and (not procs or any(o in holders for o in joined)):
            mem = dict.fromkeys(holders, 0.0)
            sm = dict.fromkeys(holders, 0.0)
        for p, o in zip(procs, joined, strict=True):
            if o not in mem:
                o = UNATTRIBUTED
            if p.used_mib is not None:
                mem[o] = mem.get(o, 0.0) + p.used_mib
            if p.sm_util is not None:
                sm[o] = sm.get(o, 0.0) + p.sm_util
        if any(p.used_mib is None for p in procs):
            mem = {}  # NVML withholds process memory (MIG): no share is known, not 0
        out.append(Split(dev, mem, {} if dev.is_mig else sm))
    return out
