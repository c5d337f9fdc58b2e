"""DRA claims' devices: the owner labels a claim gives, the live MIG instance of a
dynamic MIG device, and the taints that make a device unhealthy.

NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes its devices in ResourceSlices
(apiserver/slices.py); the kubelet names a claim's device by driver, pool and name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from exporter.frame import Owner
from exporter.workloads import ids

DRIVER = "gpu.nvidia.com"


def claim_owner(container: Owner, dr: Any, cr: Any, key: str, dev: Any) -> Owner:
    """``container`` holding device ``key`` through claim ``dr``'s resource ``cr``, with
    dcgm-exporter's DRA labels: the MIG profile and the instance's UUID (its key) where the
    ResourceSlice device is a MIG device."""
    mig = dev is not None and dev.type == "mig"
    return replace(
        container,
        claim=dr.claim_name,
        claim_namespace=dr.claim_namespace,
        driver=cr.driver_name,
        pool=cr.pool_name,
        device=cr.device_name,
        mig_profile=dev.profile if mig else "",
        mig_uuid=key if mig else "",
    )


UNHEALTHY_EFFECTS = ("NoSchedule", "NoExecute")  # a taint of effect None only informs


def unhealthy_taints(dev: Any) -> list[str]:
    """key=value (key alone without a value) of each taint on a ResourceSlice device
    that keeps new pods off it (NVIDIA's DRA driver: gpu.nvidia.com/xid=<XID>,
    gpu.nvidia.com/gpu-lost)."""
    if dev is None:
        return []
    return [f"{k}={v}" if v else k for k, v, e in dev.taints if e in UNHEALTHY_EFFECTS]


def dynamic_mig(resolver: ids.Resolver, dev: Any) -> tuple[str | None, str]:
    """The live MIG instance of a DRA device created at allocation (dynamic MIG: the slice
    has no UUID), or None and why it cannot be told. Its name gives the placement (NVIDIA's
    driver) and NVML each instance's: that decides among instances of one profile; a name
    without it decides only when the GPU has one instance of the profile."""
    if dev is None:
        return None, "no ResourceSlice device of that name"
    if dev.type != "mig" or not dev.parent_uuid:
        return None, "its ResourceSlice device has no UUID and is no MIG device of a GPU"
    if dev.placement is not None:
        key = resolver.by_placement(dev.parent_uuid, dev.profile, dev.placement)
        why = f"no single {dev.profile} instance at memory slice {dev.placement} of its GPU"
        return key, why
    key = resolver.by_profile(dev.parent_uuid, dev.profile)
    return key, f"its name gives no placement and its GPU has not exactly one {dev.profile}"
