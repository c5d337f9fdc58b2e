"""The ResourceSlice NVIDIA's DRA driver would publish for the simulated node.

One pool named after the node, driver ``gpu.nvidia.com``: each GPU out of MIG mode
as ``gpu-N`` (``type: gpu`` and its ``uuid``), each live MIG instance under the
driver's name ``gpu-N-mig-<profile>-<profile id>-<placement start>`` (``type: mig``,
``parentUUID``, ``profile``) and, as for dynamic MIG before the device is prepared,
no ``uuid``. ``resource.k8s.io/v1`` puts a device's attributes directly on it,
``v1beta1`` under ``basic``. ``taints`` maps a device name to the taints (``{key,
value, effect}``) the driver puts on it; v1beta1 has none. ``shared`` names the
devices published with ``allowMultipleAllocations`` (KEP-5075 consumable capacity:
several claims each consume part of the device's ``memory`` capacity), and
:func:`resource_claim` is the allocated claim the scheduler writes for one of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from exporter.sim.devices import GpuState
from exporter.sim.pods import DRA_DRIVER

VERSIONS = ("v1", "v1beta1")


def _string(v: str) -> dict[str, str]:
    return {"string": v}


def _devices(gpus: Iterable[GpuState]) -> list[tuple[str, dict[str, Any], int]]:
    """(name, attributes, memory MiB) of each device the driver publishes."""
    out = []
    for g in gpus:
        if not g.mig_enabled:
            attrs = {"type": _string("gpu"), "uuid": _string(g.uuid), "minor": {"int": g.index}}
            out.append((f"gpu-{g.index}", attrs, g.model.memory_mib))
            continue
        for m in g.migs:
            p = m.spec.profile
            name = f"gpu-{g.index}-mig-{p.name.replace('.', '')}-{p.id}-{m.spec.start}"
            attrs = {
                "type": _string("mig"),
                "parentUUID": _string(g.uuid),
                "profile": _string(p.name),
            }
            out.append((name, attrs, p.memory_mib))
    return out


def resource_slice(
    gpus: Iterable[GpuState],
    node: str,
    version: str = "v1",
    taints: Mapping[str, list[dict[str, str]]] | None = None,
    shared: Iterable[str] = (),
) -> dict[str, Any]:
    """The pool's one ResourceSlice as the API server serves it under ``version``."""
    shared = frozenset(shared)
    if version not in VERSIONS:
        raise ValueError(f"ResourceSlice version {version!r}: one of {', '.join(VERSIONS)}")
    devices = []
    for name, attrs, mib in _devices(gpus):
        body: dict[str, Any] = {"attributes": attrs, "capacity": {"memory": {"value": f"{mib}Mi"}}}
        if version == "v1beta1":
            devices.append({"name": name, "basic": body})
            continue
        if taints and name in taints:
            body["taints"] = taints[name]
        if name in shared:
            body["allowMultipleAllocations"] = True
        devices.append({"name": name, **body})
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRA_DRIVER}-sim"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def resource_claim(
    name: str,
    namespace: str,
    node: str,
    device: str,
    consumed: Mapping[str, str],
    version: str = "v1",
) -> dict[str, Any]:
    """An allocated ResourceClaim of the driver's ``device`` in pool ``node`` that
    consumes ``consumed`` (capacity name -> quantity, e.g. ``{"memory": "20Gi"}``) of it,
    as the scheduler records a consumable-capacity allocation (one share, its shareID)."""
    if version not in VERSIONS:
        raise ValueError(f"ResourceClaim version {version!r}: one of {', '.join(VERSIONS)}")
    result = {
        "request": "gpu",
        "driver": DRA_DRIVER,
        "pool": node,
        "device": device,
        "shareID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{node}/{namespace}/{name}")),
        "consumedCapacity": dict(consumed),
    }
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
