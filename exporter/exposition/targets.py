"""Which devices carry series: dcgm-exporter's ``-d/--devices`` selection.

- ``f`` (default): each GPU; on a MIG-enabled GPU with instances, its GPU
  instances instead, for every field. A device-level field (power,
  temperature, clocks, ECC, NVLink, ...) is then the parent's value repeated
  per instance, with the instance's ``GPU_I_PROFILE``/``GPU_I_ID`` and pod
  labels, and the parent has no series of its own, as in dcgm-exporter.
- ``g[:IDS]``: physical GPUs only (by ``gpu`` index): device-level fields once
  per GPU, instance-level fields on whole GPUs; no MIG instance series.
- ``i[:IDS]``: GPU instances only (by ``GPU_I_ID``, on every MIG GPU).
- ``g[:IDS]+i[:IDS]``: both: the series of ``g`` and those of ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Targets:
    """One cycle's series devices.

    ``device``: (device whose labels a device-level series carries, key of the
    physical GPU whose value it shows). ``instance``: devices of instance-level
    series. ``down``: GPUs not answering that stay selected (their health).
    """

    device: tuple[tuple[Device, str], ...]
    instance: tuple[Device, ...]
    down: tuple[Device, ...]


def _picked(ids: frozenset[int] | None, n: int | None) -> bool:
    return ids is None or n in ids


def _gpu_instances(insts: list[Device]) -> list[Device]:
    """One device per GPU instance (a GPU instance split into compute instances counts once)."""
    seen: set[int | None] = set()
    out = []
    for m in sorted(insts, key=lambda d: (d.gi or 0, d.ci or 0)):
        if m.gi not in seen:
            seen.add(m.gi)
            out.append(m)
    return out


def targets(snap: Snapshot, selection: Any = None) -> Targets:
    """The devices that carry series under ``selection`` (a DeviceSelection; None: ``f``)."""
    mode = getattr(selection, "mode", "f")
    ids: frozenset[int] | None = getattr(selection, "ids", None)
    if mode == "g+i":
        g_part = targets(snap, _Pick("g", ids))
        i_part = targets(snap, _Pick("i", selection.instance_ids))
        return Targets(
            g_part.device + i_part.device, g_part.instance + i_part.instance, g_part.down
        )
    whole = {e.key for e in snap.entities if not e.is_mig}
    by_parent: dict[str, list[Device]] = {}
    for e in snap.entities:
        if e.parent is not None:
            by_parent.setdefault(e.parent.key, []).append(e)
    if mode == "g":
        return Targets(
            tuple((g, g.key) for g in snap.gpus if _picked(ids, g.index)),
            tuple(e for e in snap.entities if not e.is_mig and _picked(ids, e.index)),
            tuple(g for g in snap.down if _picked(ids, g.index)),
        )
    if mode == "i":
        chosen = [
            m
            for g in snap.gpus
            for m in _gpu_instances(by_parent.get(g.key, []))
            if _picked(ids, m.gi)
        ]
        gis = {(m.uuid, m.gi) for m in chosen}
        return Targets(
            tuple((m, g.key) for m in chosen if (g := m.parent) is not None),
            tuple(e for e in snap.entities if e.is_mig and (e.uuid, e.gi) in gis),
            (),
        )
    device: list[tuple[Device, str]] = []
    for g in snap.gpus:
        insts = by_parent.get(g.key) if g.key not in whole else None
        if insts:
            device.extend((m, g.key) for m in _gpu_instances(insts))
        else:
            device.append((g, g.key))
    return Targets(tuple(device), snap.entities, snap.down)


@dataclass(frozen=True, slots=True)
class _Pick:
    mode: str
    ids: frozenset[int] | None


def unmatched(snap: Snapshot, selection: Any = None) -> frozenset[int]:
    """IDs that ``-d g:IDS`` / ``-d i:IDS`` names but no GPU or GPU instance of ``snap`` has
    (for ``g+i``, those of its ``g`` part)."""
    ids: frozenset[int] | None = getattr(selection, "ids", None)
    if not ids:
        return frozenset()
    if getattr(selection, "mode", "f") in ("g", "g+i"):
        have = {g.index for g in snap.gpus + snap.down}
    else:
        have = {e.gi for e in snap.entities if e.is_mig and e.gi is not None}
    return frozenset(ids - have)
