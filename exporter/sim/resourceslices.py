"""The ResourceSlice NVIDIA's DRA driver would publish for the simulated node.

One pool named after the node, driver ``gpu.nvidia.com``: each GPU out of MIG mode
as ``gpu-N`` (``type: gpu`` and its ``uuid``), each live MIG instance under the
driver's name ``gpu-N-mig-<profile>-<profile id>-<placement start>`` (``type: mig``,
``parentUUID``, ``profile``) and, as for dynamic MIG before the device is prepared,
no ``uuid``. ``resource.k8s.io/v1`` puts a device's attributes directly on it,
``v1beta1`` under ``basic``. ``taints`` maps a device name to the taints (``{key,
value, effect}``) the driver puts on it; v1beta1 has none.
"""

from __future__ import annotations

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
) -> dict[str, Any]:
    """The pool's one ResourceSlice as the API server serves it under ``version``."""
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
