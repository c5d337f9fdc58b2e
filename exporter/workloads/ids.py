"""Device IDs as the kubelet reports them, resolved to the exporter's device keys.

Forms (the device plugins of NVIDIA and GKE): ``GPU-<uuid>``, ``MIG-<uuid>``,
``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470), any of them with a
``::<replica>`` suffix (time-slicing, MPS), and GKE's
``nvidia<N>[/gi<K>][/vgpu<M>]``. A device key is the UUID of a whole GPU or
of a MIG instance, the same key the collector uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.nvml.devices import Device
from exporter.workloads.limits import MAX_DEVICE_ID_CHARS

# Numbers are at most 9 digits: int() of thousands of digits raises, and no GPU has more.
_GKE = re.compile(r"^nvidia(\d{1,9})(?:/gi(\d{1,9}))?(?:/vgpu(\d{1,9}))?$")
_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d{1,9})/(\d{1,9})$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]{8,}$")


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A parsed device ID: either a UUID, or a parent GPU plus instance ids, or a minor number."""

    raw: str
    uuid: str = ""  # GPU-... or MIG-... when the ID names one directly
    parent_uuid: str = ""  # MIG-GPU-<uuid>/<gi>/<ci>
    minor: int | None = None  # GKE nvidia<N>
    gi: int | None = None
    ci: int | None = None
    replica: str = ""  # ::N or /vgpuN: one share of a device that others may hold too


def parse(device_id: str) -> DeviceRef | None:
    """Parse one device ID; None when it has none of the known forms or is longer
    than ``MAX_DEVICE_ID_CHARS``."""
    if not isinstance(device_id, str) or len(device_id) > MAX_DEVICE_ID_CHARS:
        return None
    raw = device_id.strip()
    base, _, replica = raw.partition("::")
    m = _GKE.match(base)
    if m:
        gi = int(m.group(2)) if m.group(2) is not None else None
        return DeviceRef(raw, minor=int(m.group(1)), gi=gi, replica=m.group(3) or replica)
    m = _OLD_MIG.match(base)
    if m:
        return DeviceRef(
            raw, parent_uuid=m.group(1), gi=int(m.group(2)), ci=int(m.group(3)), replica=replica
        )
    if _UUID.match(base):
        return DeviceRef(raw, uuid=base, replica=replica)
    return None


class Resolver:
    """Maps parsed device IDs to device keys for one inventory of GPUs and MIG instances."""

    def __init__(self, gpus: Iterable[Device], instances: Iterable[Device]) -> None:
        self._keys: set[str] = set()
        self._minor: dict[int, Device] = {}
        self._mig: dict[tuple[str, int], list[Device]] = {}
        self._profiles: dict[tuple[str, str], list[Device]] = {}
        for g in gpus:
            self._keys.add(g.key)
            device_label = dict(g.labels).get("device", "")
            if device_label.startswith("nvidia") and device_label[6:].isdigit():
                self._minor[int(device_label[6:])] = g
        for m in instances:
            self._keys.add(m.key)
            self._mig.setdefault((m.uuid, m.gi or 0), []).append(m)
            self._profiles.setdefault((m.uuid, m.profile), []).append(m)

    def key(self, ref: DeviceRef) -> str | None:
        """The device key the ID names, or None when no known device matches."""
        if ref.uuid:
            return ref.uuid if ref.uuid in self._keys else None
        if ref.parent_uuid:
            return self._instance(ref.parent_uuid, ref.gi, ref.ci)
        if ref.minor is not None:
            gpu = self._minor.get(ref.minor)
            if gpu is None:
                return None
            if ref.gi is None:
                return gpu.key
            return self._instance(gpu.uuid, ref.gi, None)
        return None

    def _instance(self, parent: str, gi: int | None, ci: int | None) -> str | None:
        for m in self._mig.get((parent, gi or 0), []):
            if ci is None or m.ci == ci:
                return m.key
        return None

    def by_profile(self, parent_uuid: str, profile: str) -> str | None:
        """The MIG instance of this profile (e.g. ``1g.10gb``) on this parent GPU, for a
        DRA device created at allocation time (dynamic MIG), which names only those
        two; None when there is no such instance, or several (they cannot be told
        apart by what the claim says)."""
        found = self._profiles.get((parent_uuid, profile), [])
        return found[0].key if len(found) == 1 else None

    def by_placement(self, parent_uuid: str, profile: str, start: int) -> str | None:
        """The MIG instance of this profile whose GPU instance starts at memory slice
        ``start`` on this parent GPU (NVML's placement, which NVIDIA's DRA driver writes
        into the device's name); None when there is none, or several (compute instances
        of one GPU instance)."""
        found = [m for m in self._profiles.get((parent_uuid, profile), []) if m.placement == start]
        return found[0].key if len(found) == 1 else None
