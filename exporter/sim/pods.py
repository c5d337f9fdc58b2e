"""Pods on the simulated node: which container holds which device, from when to when.

NVML knows nothing of pods; the kubelet does. A fleet file's ``pods`` section is
the kubelet's side of the same node, so that a test or a demo can serve the
pod-resources ``List`` answer that goes with the simulated devices at any sim
time (:func:`running`), pods starting and stopping mid-cycle included. Device
references name the simulated devices, resolved against the driver's current
state: ``gpu:N`` (GPU N's UUID), ``gpu:N::R`` (replica R of a time-sliced GPU),
``mig:N:GI`` (the MIG device with GPU instance id GI on GPU N). A pod with ``claim``
holds its devices through that DRA ResourceClaim (in the pod's namespace) of NVIDIA's
DRA driver instead: the answer names each device by driver, pool (the node's name) and
the driver's device name (``gpu-N``, ``gpu-N-mig-<profile>-<profile id>-<placement>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.sim.schema import Reader, join

if TYPE_CHECKING:
    from exporter.sim.devices import GpuState
    from exporter.sim.specs import GpuSpec

POD_KEYS = ("name", "namespace", "container", "resource", "devices", "start", "end", "claim")
DRA_DRIVER = "gpu.nvidia.com"
_REF = re.compile(r"^(?:gpu:(\d+)(?:::(\w+))?|mig:(\d+):(\d+))$")
RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class PodSpec:
    """One pod with one container holding ``devices`` from ``start`` to ``end`` (sim s)."""

    name: str
    namespace: str
    container: str
    resource: str
    devices: tuple[str, ...]  # references: gpu:N, gpu:N::R, mig:N:GI
    start: float = 0.0
    end: float | None = None  # None: runs on
    claim: str = ""  # a DRA ResourceClaim's name: the devices are held through it

    def alive(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


def parse_pods(r: Reader, raw: Any, gpus: tuple[GpuSpec, ...]) -> tuple[PodSpec, ...]:
    """The ``pods`` section; each device reference must name a GPU (or MIG device) of the
    fleet's initial layout."""
    out = []
    for i, p in enumerate(r.sequence(raw, "pods")):
        path = join("pods", i)
        p = r.mapping(p, path, POD_KEYS, ("name", "devices"))
        refs = tuple(
            _ref(r, v, join(join(path, "devices"), j), gpus)
            for j, v in enumerate(r.sequence(p["devices"], join(path, "devices")))
        )
        start = r.number(p.get("start", 0), join(path, "start"), lo=0)
        end = p.get("end")
        out.append(
            PodSpec(
                name=r.string(p["name"], join(path, "name")),
                namespace=r.string(p.get("namespace", "default"), join(path, "namespace")),
                container=r.string(p.get("container", "main"), join(path, "container")),
                resource=r.string(p.get("resource", RESOURCE), join(path, "resource")),
                devices=refs,
                start=start,
                end=None if end is None else r.number(end, join(path, "end"), lo=start),
                claim=r.string(p.get("claim", ""), join(path, "claim")),
            )
        )
    return tuple(out)


def _ref(r: Reader, value: Any, path: str, gpus: tuple[GpuSpec, ...]) -> str:
    ref = r.string(value, path)
    m = _REF.match(ref)
    if m is None:
        r.fail(path, f"'{ref}' is not a device reference; use gpu:N, gpu:N::R or mig:N:GI")
    index = int(m.group(1) or m.group(3))
    if index >= len(gpus):
        r.fail(path, f"'{ref}': the node has GPUs 0 to {len(gpus) - 1}")
    gpu = gpus[index]
    if m.group(4) is not None:
        gi = int(m.group(4))
        if gpu.mig is None or all(s.gi != gi for s in gpu.mig):
            r.fail(path, f"'{ref}': GPU {index} has no MIG device with GPU instance id {gi}")
    elif gpu.mig is not None:
        r.fail(path, f"'{ref}': GPU {index} is in MIG mode; name a MIG device (mig:N:GI)")
    return ref


def device_id(ref: str, gpus: list[GpuState]) -> str | None:
    """The device-plugin ID a reference stands for now, or None when the device is gone
    (a MIG layout changed since)."""
    m = _REF.match(ref)
    assert m is not None, ref
    gpu = gpus[int(m.group(1) or m.group(3))]
    if m.group(4) is not None:
        dev = gpu.mig_by_gi(int(m.group(4)))
        return dev.uuid if dev is not None else None
    return f"{gpu.uuid}::{m.group(2)}" if m.group(2) is not None else gpu.uuid


def dra_name(ref: str, gpus: list[GpuState]) -> str | None:
    """The name NVIDIA's DRA driver gives the device a reference stands for now (k8s-dra-
    driver-gpu's CanonicalName; the minor number is the GPU's index here), or None when
    the device is gone."""
    m = _REF.match(ref)
    assert m is not None, ref
    index = int(m.group(1) or m.group(3))
    if m.group(4) is None:
        return f"gpu-{index}"
    dev = gpus[index].mig_by_gi(int(m.group(4)))
    if dev is None:
        return None
    p = dev.spec.profile
    return f"gpu-{index}-mig-{p.name.replace('.', '')}-{p.id}-{dev.spec.start}"


def running(
    pods: tuple[PodSpec, ...], gpus: list[GpuState], t: float, pool: str = ""
) -> list[dict[str, Any]]:
    """The pods running at sim time ``t`` as pod-resources ``List`` entries (plain data:
    name, namespace, containers with name, devices of resource_name and device_ids, and
    claims of name, namespace and devices of driver, pool and device name)."""
    out = []
    for p in pods:
        if not p.alive(t):
            continue
        container: dict[str, Any] = {"name": p.container, "devices": []}
        if p.claim:
            names = [n for n in (dra_name(ref, gpus) for ref in p.devices) if n is not None]
            held = [{"driver": DRA_DRIVER, "pool": pool, "device": n} for n in names]
            container["claims"] = [{"name": p.claim, "namespace": p.namespace, "devices": held}]
        else:
            ids = [i for i in (device_id(ref, gpus) for ref in p.devices) if i is not None]
            if ids:
                container["devices"] = [{"resource_name": p.resource, "device_ids": ids}]
        out.append({"name": p.name, "namespace": p.namespace, "containers": [container]})
    return out
