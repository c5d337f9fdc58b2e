"""One cycle's accounting weights per physical GPU: who holds what part, busy, idle, energy.

A plan is what a cycle saw; the ledger charges the interval from this cycle to the
next with it (the state at an interval's start holds for the whole interval), so the
error of a holder's totals is at most one collection interval per change.

Per physical GPU, the parts add up by construction: the holders' allocated parts plus
the unallocated part are 1 (GPU-seconds per second), and their energy parts plus the
unattributed part are 1 (of the GPU's energy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.frame import DeviceUse, HolderKey, Window
from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since the driver loaded
UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent, whole GPUs
MIG_ACTIVITY = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")  # ratios, GPM
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB; whether a device no one holds has memory in use
# read every cycle whatever the metrics file lists (GPM only when it lists it: it costs)
ALWAYS_READ = (ENERGY, UTIL, FB_USED)


# One holder's part of one GPU during an interval: (holder, device labels, alloc, busy,
# idle, energy, active). ``alloc``: GPU-seconds per second it holds; ``busy``: of those,
# busy ones; ``idle``: whether the whole of ``alloc`` counts as idle; ``energy``: its part
# of the GPU's energy (0..1); ``active``: its activity in parts of the whole GPU
# (GpuPlan.active). A tuple: a cycle makes one per holder.
Share = tuple[HolderKey, tuple[tuple[str, str], ...], float, float, bool, float, float]
_NONE: Mapping[str, float] = {}


@dataclass(frozen=True, slots=True)
class _Part:
    """What a device's holders hold, known before its activity is: kept while the device
    and its holders stay the same objects."""

    key: HolderKey
    alloc: float  # GPU-seconds per second
    energy: float  # part of the GPU's energy
    own: float | None  # its own measured activity (shared GPUs: its SM share), else None
    running: bool | None


@dataclass(slots=True)
class GpuPlan:
    """One physical GPU as a cycle saw it."""

    key: str
    labels: tuple[tuple[str, str], ...]
    taken_at: float  # unix seconds
    energy_mj: float | None  # the energy counter, None when it could not be read
    shares: list[Share] = field(default_factory=list)
    unallocated: float = 1.0  # GPU-seconds per second nobody held
    unattributed: float = 1.0  # part of the energy no holder gets
    unknown: float = 0.0  # GPU-seconds per second whose holders are not known, and energy
    reason: str = ""  # why they are not known
    active: float = 0.0  # the activity of all its devices and processes, in parts of it
    # since the last cycle (pod attribution's windows): unix s each holder of ``shares``
    # first seen now began, each holder that stopped ended (sightings.py), and the
    # holders that began and stopped between the two cycles, with their window
    starts: dict[HolderKey, float] = field(default_factory=dict)
    ends: dict[HolderKey, float] = field(default_factory=dict)
    passing: list[tuple[Share, float, float]] = field(default_factory=list)


def measured(dev: Device, values: Mapping[str, float]) -> tuple[float, str]:
    """Activity 0..1 of a device, for busy GPU-seconds and the energy split by activity
    alike, and its basis: GPM SM activity (else graphics-engine activity) on whole GPUs
    and MIG instances alike ("gpm"); where the GPU has no GPM, a whole GPU's utilization
    ("utilization"); else nothing measured (0, "allocation")."""
    for name in MIG_ACTIVITY:
        v = values.get(name)
        if v is not None and v == v:  # GPM can answer NaN
            return min(max(float(v), 0.0), 1.0), "gpm"
    util = values.get(UTIL)
    if not dev.is_mig and util is not None:
        return min(max(util / 100.0, 0.0), 1.0), "utilization"
    return 0.0, "allocation"


class Planner:
    """Builds each cycle's plans; what does not depend on the readings is kept while a
    device and its holders (the same objects) stay."""

    def __init__(self, idle_below: float) -> None:
        self.idle_below = idle_below
        self._parts: dict[str, tuple[Device, DeviceUse | None, tuple[_Part, ...]]] = {}
        self._layout: tuple[tuple[Device, ...], tuple[Device, ...], list[Any]] = ((), (), [])
        self.bases: list[tuple[Device, str]] = []  # the last plans' (device, activity basis)

    def _gpus(self, snap: Snapshot) -> list[tuple[Device, list[Device]]]:
        """Each physical GPU with the devices that hold its parts (itself, or its MIG
        instances), kept while the snapshot's devices are the same objects."""
        gpus, entities, layout = self._layout
        if snap.gpus == gpus and snap.entities == entities:  # identity: Device has eq=False
            return layout
        by_parent: dict[str, list[Device]] = {}
        for d in snap.entities:
            by_parent.setdefault((d.parent or d).key, []).append(d)
        layout = [(g, by_parent.get(g.key, [])) for g in snap.gpus]
        self._layout = (snap.gpus, snap.entities, layout)
        return layout

    def plans(
        self,
        snap: Snapshot,
        uses: Mapping[str, DeviceUse] | None,
        unknown: str = "",
        windows: Mapping[HolderKey, Window] | None = None,
    ) -> dict[str, GpuPlan]:
        """Plans of the GPUs of ``snap`` that answered, by GPU key.

        ``uses`` maps device keys to their holders (pod attribution); None without
        Kubernetes, where every whole GPU and MIG instance is its own holder. ``unknown``:
        why who holds what is not known this cycle (the kubelet away): every device's
        part then goes to the GPU's unknown part, with that reason, not to a holder.
        ``windows``: when holders began and stopped since the last cycle (GpuPlan).
        """
        if unknown and uses is not None:
            return self._unknown(snap, unknown)
        values = snap.values
        idle_below = self.idle_below
        kept = self._parts
        parts = {}
        out = {}
        self.bases = bases = []
        for gpu, devices in self._gpus(snap):
            plan = GpuPlan(
                gpu.key, gpu.labels, snap.taken_at, values.get(gpu.key, _NONE).get(ENERGY)
            )
            shares = plan.shares
            for dev in devices:
                use = None if uses is None else uses.get(dev.key)
                k = kept.get(dev.key)
                static = k[2] if k is not None and k[0] is dev and k[1] is use else None
                if static is None:
                    static = _parts(dev, use, uses is None)
                parts[dev.key] = (dev, use, static)
                got = values.get(dev.key, _NONE)
                level, basis = measured(dev, got)
                if not static:
                    plan.active += _size(dev) * level
                    continue
                a = None if basis == "allocation" else level  # busy: the same measure
                joined = any(p.own is not None for p in static)  # per-process SM samples
                if joined and use is not None:
                    basis = "processes"
                    plan.active += _size(dev) * use.unattributed_sm_percent / 100.0
                bases.append((dev, basis))
                for p in static:
                    own = a if p.own is None else p.own
                    idle = p.running is False or (own is not None and own < idle_below)
                    active = p.alloc * ((p.own or 0.0) if joined else level)
                    plan.active += active
                    busy = p.alloc * (own or 0.0)
                    shares.append((p.key, dev.labels, p.alloc, busy, idle, p.energy, active))
                    plan.unallocated -= p.alloc
                    plan.unattributed -= p.energy
            out[gpu.key] = plan
        self._parts = parts
        if windows:
            _place(windows, out, self._gpus(snap))
        return out

    def _unknown(self, snap: Snapshot, reason: str) -> dict[str, GpuPlan]:
        """Plans where no holder is known: each device's part of its GPU (a MIG
        instance's slices, a whole GPU all of it) is unknown, time and energy alike."""
        out = {}
        for gpu, devices in self._gpus(snap):
            plan = GpuPlan(
                gpu.key, gpu.labels, snap.taken_at, snap.values.get(gpu.key, _NONE).get(ENERGY)
            )
            plan.reason = reason
            for dev in devices:
                part = _size(dev)
                plan.unknown += part
                plan.unallocated -= part
                plan.unattributed -= part
            out[gpu.key] = plan
        return out


def _place(
    windows: Mapping[HolderKey, Window],
    plans: Mapping[str, GpuPlan],
    layout: list[tuple[Device, list[Device]]],
) -> None:
    """Put each window on its GPU's plan: the start of a holder it holds, the end of one
    it no longer holds, and a holder that came and went between cycles as a share of its
    own (its device's part times its share, its energy by allocation, not busy, no
    activity measured)."""
    devices = {d.key: (gpu.key, d) for gpu, devs in layout for d in devs}
    for plan in plans.values():
        held = {share[0] for share in plan.shares}
        for key in held & windows.keys():
            start = windows[key].start
            if start is not None:
                plan.starts[key] = start
    for key, w in windows.items():
        found = devices.get(key[0])
        if found is None or w.end is None:
            continue
        on = plans.get(found[0])
        if on is None or key in on.starts:
            continue
        on.ends[key] = w.end
        if w.start is not None:
            alloc = _size(found[1]) * min(max(w.share, 0.0), 1.0)
            share = (key, found[1].labels, alloc, 0.0, False, alloc, 0.0)
            on.passing.append((share, w.start, w.end))


def _size(dev: Device) -> float:
    """A device's part of its GPU: 1 for a whole GPU, a MIG instance's slices over the
    GPU's (0 when either is not known: it stays unallocated)."""
    if dev.is_mig:
        return dev.slices / dev.gpu_slices if dev.slices and dev.gpu_slices else 0.0
    return 1.0


def _parts(dev: Device, use: DeviceUse | None, own_holder: bool) -> tuple[_Part, ...]:
    """The holders' parts of ``dev``; ``own_holder``: without Kubernetes, the device
    holds itself."""
    part = _size(dev)
    if not part:
        return ()  # its size is not known: it stays unallocated
    if own_holder:
        return (_Part((dev.key, "", "", ""), part, part, None, None),)
    if use is None or not use.claims:
        return ()  # nobody holds it: its part stays unallocated and unattributed
    claims = use.claims
    held = min(sum(c.share for c in claims), 1.0)  # replicas nobody holds stay unallocated
    shared = len(claims) > 1
    measured = [c.sm_percent for c in claims if c.sm_percent is not None]
    sm_total = sum(measured) + use.unattributed_sm_percent if shared and measured else 0.0
    out = []
    for c in claims:
        share = c.share
        own = None
        if shared and c.sm_percent is not None and share > 0:
            own = min(1.0, c.sm_percent / 100.0 / share)  # how much of its share it used
        # the held part of the energy, split by measured SM share where there is one
        energy = held * (c.sm_percent or 0.0) / sm_total if sm_total > 0 else share
        out.append(
            _Part(
                (dev.key, c.namespace, c.pod, c.container),
                part * share,
                part * energy,
                own,
                c.running,
            )
        )
    return tuple(out)
