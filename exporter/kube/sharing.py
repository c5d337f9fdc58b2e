"""Per-container series for devices shared by several containers (time-slicing, MPS).

Device series of a shared GPU keep no pod labels (one value copied to every
pod would be a lie). What can be split honestly is split: framebuffer used,
from each process's memory, and SM utilization, from per-process samples,
summed per container. Every container that holds the device gets a series,
at 0 when it runs nothing; memory of processes that cannot be joined to a
holder is reported with empty pod labels, so the parts still add up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exporter.kube.mapper import Owner, PodMap
from exporter.nvml.devices import Device, escape
from exporter.snapshot import Snapshot

FB = "gpu_exporter_container_fb_used_mib"
SM = "gpu_exporter_container_sm_util_percent"
HELP = {
    FB: "Framebuffer used by the container's processes on a shared GPU or MIG instance (MiB).",
    SM: "SM utilization of the container's processes on a shared GPU (percent of the GPU).",
}
UNATTRIBUTED = Owner("", "", "")


def render_shared(
    snap: Snapshot,
    podmap: PodMap,
    owner_of: Callable[[Any], Owner | None] | None,
) -> tuple[str, int]:
    """Text and series count of the per-container families.

    ``owner_of`` maps a process's container reference to the holder it belongs to,
    or is None when processes cannot be joined to pods (no API server).
    """
    by_key: Mapping[str, Device] = {d.key: d for d in snap.entities}
    lines: dict[str, list[str]] = {FB: [], SM: []}
    for key in sorted(podmap.shared):
        dev = by_key.get(key)
        if dev is None:
            continue
        holders = podmap.owners[key]
        procs = snap.processes.get(key, ())
        joined = [owner_of(p.container) if owner_of else None for p in procs]
        mem: dict[Owner, float] = {}
        sm: dict[Owner, float] = {}
        # Holders get series (0 when idle) only where the join works for this device: a
        # device where no process could be joined (no host PIDs, say) shows the total only.
        if owner_of is not None and (not procs or any(o in holders for o in joined)):
            mem = dict.fromkeys(holders, 0.0)
            sm = dict.fromkeys(holders, 0.0)
        for p, o in zip(procs, joined, strict=True):
            if o not in mem:
                o = UNATTRIBUTED
            if p.used_mib is not None:
                mem[o] = mem.get(o, 0.0) + p.used_mib
            if p.sm_util is not None:
                sm[o] = sm.get(o, 0.0) + p.sm_util
        for o, v in mem.items():
            lines[FB].append(_line(FB, dev, o, v))
        if not dev.is_mig:
            for o, v in sm.items():
                lines[SM].append(_line(SM, dev, o, v))
    out, n = [], 0
    for name, ls in lines.items():
        if ls:
            out.append(f"# HELP {name} {HELP[name]}\n# TYPE {name} gauge\n")
            out.extend(ls)
            n += len(ls)
    return "".join(out), n


def _line(name: str, dev: Device, o: Owner, v: float) -> str:
    labels = (
        f'{dev.text},pod="{escape(o.pod)}",namespace="{escape(o.namespace)}",'
        f'container="{escape(o.container)}"'
    )
    return f"{name}{{{labels}}} {round(v, 3)!r}\n"
