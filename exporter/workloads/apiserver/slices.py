"""DRA ResourceSlices: the devices a DRA driver publishes, indexed by (driver, pool, name).

A claim in the kubelet's answer names its device by driver, pool and device
name only; the slice says which GPU or MIG instance that is (``uuid``), or for
a MIG device created at allocation time (dynamic MIG), its parent GPU and
profile. The number of slices and devices kept is bounded (limits.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.workloads import limits
from exporter.workloads.apiserver.claims import capacities
from exporter.workloads.limits import Drops

Slice = tuple[str, str, int, tuple["SliceDevice", ...]]  # driver, pool, generation, devices
# NVIDIA's DRA driver names a MIG device gpu-<minor>-mig-<profile>-<profile id>-<placement
# start> (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/mig.go, ToCanonicalName)
MIG_NAME = re.compile(r"gpu-(\d{1,4})-mig-(.+)-(\d{1,4})-(\d{1,4})")
MAX_TAINTS = 16  # taints kept per device (KEP-5055 allows 4 per device; drivers add their own)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device published in a ResourceSlice; attributes absent on it are ""."""

    driver: str
    pool: str
    name: str
    type: str
    uuid: str
    parent_uuid: str
    profile: str
    placement: int | None = None  # a MIG device's first memory slice, from its name
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect), at most MAX_TAINTS
    capacity: tuple[tuple[str, float], ...] = ()  # (name, amount) of its capacity map
    shared: bool = False  # allowMultipleAllocations: several claims consume its capacity


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _text(v: Any) -> str:
    return v if isinstance(v, str) and len(v) <= limits.MAX_NAME_CHARS else ""


def attr_value(v: Any) -> str:
    """The value of one device attribute (``{"string": ...}``, ``{"int": ...}``, ...) as text."""
    if not isinstance(v, Mapping):
        return ""
    for key in ("string", "version", "int", "bool"):
        if key in v:
            x = v[key]
            return _text(str(x).lower() if isinstance(x, bool) else str(x))
    return ""


def parse_slice(obj: Any, budget: int, drops: Drops) -> Slice:
    """(driver, pool, generation, devices) of one ResourceSlice object, with at most
    ``budget`` devices (the rest are counted as dropped)."""
    spec = _map(_map(obj).get("spec"))
    driver = _text(spec.get("driver"))
    pool = _map(spec.get("pool"))
    pool_name = _text(pool.get("name"))
    try:
        generation = int(str(pool.get("generation") or 0)[:20])
    except ValueError:
        generation = 0
    raw = spec.get("devices")
    devices: list[SliceDevice] = []
    for dev in raw if isinstance(raw, list) else ():
        if len(devices) >= budget:
            drops.add("slice_devices")
            continue
        if isinstance(dev, Mapping):
            devices.append(_device(driver, pool_name, dev))
    return driver, pool_name, generation, tuple(devices)


def _device(driver: str, pool: str, dev: Mapping[str, Any]) -> SliceDevice:
    # v1beta1 nests attributes and taints under "basic"; v1beta2 and v1 do not.
    body = _map(dev.get("basic")) if "basic" in dev else dev
    attrs = _map(body.get("attributes"))
    a = {str(k).removeprefix(driver + "/"): attr_value(v) for k, v in attrs.items()}
    name = _text(dev.get("name"))
    kind = a.get("type", "")
    named = MIG_NAME.fullmatch(name) if kind == "mig" else None
    return SliceDevice(
        driver=driver,
        pool=pool,
        name=name,
        type=kind,
        uuid=a.get("uuid", ""),
        parent_uuid=a.get("parentUUID", ""),
        profile=a.get("profile", ""),
        placement=int(named.group(4)) if named else None,
        taints=_taints(body.get("taints")),
        capacity=capacities(body.get("capacity")),
        shared=body.get("allowMultipleAllocations", dev.get("allowMultipleAllocations")) is True,
    )


def _taints(raw: Any) -> tuple[tuple[str, str, str], ...]:
    """(key, value, effect) of a device's taints (KEP-5055), the first MAX_TAINTS."""
    out = []
    for t in raw[:MAX_TAINTS] if isinstance(raw, list) else ():
        t = _map(t)
        if _text(t.get("key")):
            out.append((_text(t.get("key")), _text(t.get("value")), _text(t.get("effect"))))
    return tuple(out)


def device_index(slices: Iterable[Slice]) -> dict[tuple[str, str, str], SliceDevice]:
    """Devices of each pool's newest generation: older slices linger while a
    driver republishes."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for driver, pool, gen, _ in slices:
        newest[(driver, pool)] = max(gen, newest.get((driver, pool), gen))
    return {
        (d.driver, d.pool, d.name): d
        for driver, pool, gen, devices in slices
        if gen == newest[(driver, pool)]
        for d in devices
    }


class SliceIndex:
    """ResourceSlices by name, and their devices; snapshots are swapped whole."""

    def __init__(self, drops: Drops) -> None:
        self.drops = drops
        self._slices: dict[str, Slice] = {}
        self._devices: Mapping[tuple[str, str, str], SliceDevice] = {}

    def device(self, driver: str, pool: str, name: str) -> SliceDevice | None:
        """The device a DRA claim names, from the pool's newest generation; None if unknown."""
        return self._devices.get((driver, pool, name))

    def __len__(self) -> int:
        return len(self._devices)

    def replace(self, items: Iterable[Any]) -> None:
        """Replace every slice with those of a list answer."""
        slices: dict[str, Slice] = {}
        for obj in items:
            self._put(slices, _slice_name(obj), obj)
        self._swap(slices)

    def event(self, kind: str, obj: Any) -> None:
        """Apply one watch event (ADDED, MODIFIED or DELETED)."""
        slices = dict(self._slices)
        name = _slice_name(obj)
        if kind == "DELETED":
            slices.pop(name, None)
        else:
            slices.pop(name, None)
            self._put(slices, name, obj)
        self._swap(slices)

    def _put(self, slices: dict[str, Slice], name: str, obj: Any) -> None:
        if len(slices) >= limits.MAX_SLICES:
            self.drops.add("slices")
            return
        used = sum(len(s[3]) for s in slices.values())
        slices[name] = parse_slice(obj, max(0, limits.MAX_SLICE_DEVICES - used), self.drops)

    def _swap(self, slices: dict[str, Slice]) -> None:
        self._slices = slices
        self._devices = device_index(slices.values())


def _slice_name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return _text(meta.get("name")) if isinstance(meta, Mapping) else ""
