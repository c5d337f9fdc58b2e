"""``--kubernetes-virtual-gpus``: a shared device's series once per container holding it.

What dcgm-exporter does with the flag, for a GPU or MIG instance held by
several containers (time-slicing, MPS): every series of the device is
repeated once per holder, with that holder's ``pod``, ``namespace``,
``container`` (and ``pod_uid``, pod labels, DRA claim where enabled), and the
device's own value in each copy, so a sum over pods counts the device once
per pod. Two fields are split instead of repeated: ``DCGM_FI_DEV_GPU_UTIL``
(per-process SM utilization, percent) and ``DCGM_FI_DEV_FB_USED`` (per-process
framebuffer, MiB), summed per container, 0 for a holder that runs nothing;
for those two the device's series without pod labels stays as well.

workloads/ hands over who holds each shared device (holders) and the per-process
shares (splits); this module only turns them into label text and values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.frame import Holder, Split
from exporter.nvml.devices import Device

# DCGM field -> the Split attribute holding its per-container part
PER_PROCESS = {"DCGM_FI_DEV_GPU_UTIL": "sm", "DCGM_FI_DEV_FB_USED": "fb"}


@dataclass(frozen=True, slots=True)
class Virtual:
    """One cycle's copies of shared devices' series.

    ``copies``: device key -> the label text of each holder's copy (device
    labels, then the holder's). ``shares``: DCGM field -> device key ->
    (label text, value) per holder, for the per-process fields, present only
    where the device's processes could be joined to its holders.
    """

    copies: Mapping[str, tuple[str, ...]]
    shares: Mapping[str, Mapping[str, tuple[tuple[str, float], ...]]]


def build(
    sharers: Mapping[str, Sequence[Holder]],
    splits: Iterable[Split],
    devices: Iterable[Device],
    device_text: Callable[[Device], str],
    holder_text: Callable[[Holder], str],
) -> Virtual:
    """The copies for the shared devices among ``devices``.

    ``sharers`` maps a device key to the containers holding it (two or more);
    ``splits`` are their per-container framebuffer (MiB) and SM utilization
    (percent) from per-process data.
    """
    copies: dict[str, tuple[str, ...]] = {}
    for d in devices:
        held = sharers.get(d.key)
        if held and d.key not in copies:
            own = device_text(d)
            copies[d.key] = tuple(f"{own},{holder_text(h)}" for h in held)
    shares: dict[str, dict[str, tuple[tuple[str, float], ...]]] = {f: {} for f in PER_PROCESS}
    for s in splits:
        key = s.device.key
        held = sharers.get(key)
        if not held or key not in copies:
            continue
        for fld, attr in PER_PROCESS.items():
            part: Mapping = getattr(s, attr)
            # no holder in the split: its processes could not be joined to pods this cycle
            if any(h.owner in part for h in held):
                values = (part.get(h.owner, 0.0) for h in held)
                shares[fld][key] = tuple(zip(copies[key], values, strict=True))
    return Virtual(copies, shares)
