"""MIG layout placement: which memory slices each GPU instance takes, and its id.

NVML numbers GPU instances by a binary split of the 8 memory slices: id 0 is
the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the eighths. A 1g.10gb
instance on slice 4 is therefore GPU instance 11, a 3g.40gb on slices 4-7 is
GPU instance 2. Like NVML, an instance created without a placement takes the
highest free placement of its profile.
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter.sim.models import COMPUTE_SLICES, MEMORY_SLICES, GpuModel, MigProfile

_LEVEL = {8: 0, 4: 1, 2: 2, 1: 3}


class LayoutError(ValueError):
    """A MIG layout that cannot exist; `index` is the offending entry, if one is."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def gpu_instance_id(profile: MigProfile, start: int) -> int:
    """The GPU instance id NVML gives `profile` placed at memory slice `start`."""
    level = _LEVEL[profile.memory_slices]
    return (1 << level) - 1 + start // profile.memory_slices


def place(
    model: GpuModel, requests: Sequence[tuple[MigProfile, int | None]]
) -> list[tuple[int, int]]:
    """Place (profile, wanted GPU instance id or None) requests; returns (start, gi) per request.

    Raises LayoutError naming the first request that cannot be honoured.
    """
    starts: list[list[int]] = []
    for i, (profile, gi) in enumerate(requests):
        if gi is None:
            starts.append(sorted(profile.placements, reverse=True))
            continue
        match = [s for s in profile.placements if gpu_instance_id(profile, s) == gi]
        if not match:
            valid = ", ".join(str(gpu_instance_id(profile, s)) for s in profile.placements)
            raise LayoutError(
                f"GPU instance id {gi} is not a placement of {profile.name}; valid ids: {valid}",
                i,
            )
        starts.append(match)

    _check_budget(model, requests)
    chosen: list[int] = []

    def search(i: int, occupied: int) -> bool:
        if i == len(requests):
            return True
        profile = requests[i][0]
        for start in starts[i]:
            mask = ((1 << profile.memory_slices) - 1) << start
            if occupied & mask or start + profile.memory_slices > MEMORY_SLICES:
                continue
            chosen.append(start)
            if search(i + 1, occupied | mask):
                return True
            chosen.pop()
        return False

    if not search(0, 0):
        names = ", ".join(p.name for p, _ in requests)
        raise LayoutError(
            f"{names} do not fit together on the memory slices of {model.name};"
            " use fewer or smaller instances, or other gi ids"
        )
    return [
        (start, gpu_instance_id(p, start)) for (p, _), start in zip(requests, chosen, strict=True)
    ]


def _check_budget(model: GpuModel, requests: Sequence[tuple[MigProfile, int | None]]) -> None:
    """Raise LayoutError at the first request that exceeds the compute slices or memory."""
    used_compute = 0
    used_memory = 0
    for i, (profile, _) in enumerate(requests):
        used_compute += profile.slices
        used_memory += profile.memory_mib
        if used_compute > COMPUTE_SLICES:
            raise LayoutError(
                f"the layout needs {used_compute} compute slices by this entry;"
                f" {model.name} has {COMPUTE_SLICES}",
                i,
            )
        if used_memory > model.memory_mib:
            raise LayoutError(
                f"the layout needs {used_memory} MiB by this entry; {model.name} has"
                f" {model.memory_mib} MiB",
                i,
            )
