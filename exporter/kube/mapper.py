"""Device-to-pod map: which container holds each GPU or MIG instance.

Built once per collection interval from the kubelet's ``List`` (never per
scrape) and swapped in whole. A device held by exactly one container gets
that container's labels; a device held by several (time-slicing, MPS) gets
none, and per-container shares are computed for it instead (sharing.py).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.kube import ids
from exporter.kube.podresources import KubeletUnavailable, PodResourcesClient
from exporter.nvml.devices import Device

log = logging.getLogger(__name__)

NVIDIA_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
DRA_DRIVER = "gpu.nvidia.com"
MAX_BACKOFF_S = 60.0
GRACE_S = 30.0  # a kubelet restart removes its socket for a moment: keep labels that long
LOGGED_MAX = 1024  # unmatched IDs remembered as logged; MIG churn makes new ones forever


@dataclass(frozen=True, slots=True)
class Owner:
    """A container holding a device (through the device plugin or a DRA claim)."""

    namespace: str
    pod: str
    container: str
    claim: str = ""
    claim_namespace: str = ""


@dataclass(frozen=True, slots=True)
class PodMap:
    """Owners of each device key; immutable, replaced whole on each refresh."""

    owners: Mapping[str, tuple[Owner, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def shared(self) -> frozenset[str]:
        return frozenset(k for k, v in self.owners.items() if len(v) > 1)


class Mapper:
    """Refreshes the map from the kubelet, with timeouts and backoff; keeps the last good map."""

    def __init__(
        self,
        client: PodResourcesClient,
        resource_names: Iterable[str] = (),
        slice_device: Callable[[str, str, str], Any] | None = None,
    ) -> None:
        self.client = client
        self.patterns = tuple(NVIDIA_RESOURCES) + tuple(resource_names)
        self.slice_device = slice_device
        self.map = PodMap()
        self.status = "kubelet not asked yet"
        self.unmatched: Counter[str] = Counter()  # resource name -> device IDs matching no device
        self._logged: set[str] = set()
        self._retry_at = 0.0
        self._backoff = 1.0
        self._last_ok = float("-inf")
        self.refreshes = 0

    def wanted(self, resource_name: str) -> bool:
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.patterns)

    async def refresh(self, gpus: Iterable[Device], instances: Iterable[Device]) -> None:
        """Ask the kubelet once (unless backing off) and rebuild the map."""
        now = time.monotonic()
        if now < self._retry_at:
            return
        try:
            resp = await self.client.list()
        except KubeletUnavailable as e:
            self._fail(str(e), e, now)
            return
        except asyncio.CancelledError:
            raise
        self._backoff = 1.0
        self._last_ok = now
        self.refreshes += 1
        if self.status:
            log.info(
                "kubelet pod-resources answering again"
                if self.refreshes > 1
                else "kubelet pod-resources connected"
            )
        self.status = ""
        self.map = self.build(resp, ids.Resolver(gpus, instances))

    def _fail(self, why: str, e: KubeletUnavailable, now: float) -> None:
        # the socket missing is a steady state (no kubelet here): check again each interval
        delay = 0.0 if e.missing else self._backoff
        if e.throttled:
            delay = max(delay, 5.0)
        if not e.missing:
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        self._retry_at = now + delay
        if why != self.status:
            log.warning("%s; keeping the last pod map%s", why, " and backing off" if delay else "")
        self.status = why
        if e.missing and now - self._last_ok > GRACE_S:
            self.map = PodMap()  # no kubelet for a while: nothing vouches for old labels

    def build(self, resp: Any, resolver: ids.Resolver) -> PodMap:
        """The map from one List answer (pure; tests call it directly)."""
        owners: dict[str, list[Owner]] = {}
        for pod in resp.pod_resources:
            for c in pod.containers:
                owner = Owner(pod.namespace, pod.name, c.name)
                for dev in c.devices:
                    if not self.wanted(dev.resource_name):
                        continue
                    for device_id in dev.device_ids:
                        key = self._resolve(resolver, dev.resource_name, device_id)
                        if key is not None:
                            owners.setdefault(key, []).append(owner)
                for dr in c.dynamic_resources:
                    for cr in dr.claim_resources:
                        if cr.driver_name != DRA_DRIVER:
                            continue
                        key = self._dra_key(resolver, cr)
                        if key is not None:
                            o = Owner(
                                pod.namespace, pod.name, c.name, dr.claim_name, dr.claim_namespace
                            )
                            owners.setdefault(key, []).append(o)
        frozen = {k: tuple(dict.fromkeys(v)) for k, v in owners.items()}
        return PodMap(MappingProxyType(frozen))

    def _resolve(self, resolver: ids.Resolver, resource: str, device_id: str) -> str | None:
        ref = ids.parse(device_id)
        key = resolver.key(ref) if ref is not None else None
        if key is None:
            self.unmatched[resource] += 1
            if device_id not in self._logged:
                self._remember(device_id)
                why = "unknown ID form" if ref is None else "no such GPU or MIG instance here"
                log.warning("device ID %r of %s matches no device (%s)", device_id, resource, why)
        return key

    def _remember(self, device_id: str) -> None:
        """Note an ID as logged; past LOGGED_MAX the memory starts over (an ID may be logged
        again, once) so that IDs of instances long gone do not pile up."""
        if len(self._logged) >= LOGGED_MAX:
            self._logged.clear()
        self._logged.add(device_id)

    def _dra_key(self, resolver: ids.Resolver, cr: Any) -> str | None:
        dev = (
            self.slice_device(cr.driver_name, cr.pool_name, cr.device_name)
            if (self.slice_device)
            else None
        )
        name = f"{cr.pool_name}/{cr.device_name}"
        if dev is None or not dev.uuid:
            self.unmatched["dra:" + cr.driver_name] += 1
            if name not in self._logged:
                self._remember(name)
                log.warning("DRA device %s has no ResourceSlice with a UUID (yet)", name)
            return None
        return self._resolve(resolver, "dra:" + cr.driver_name, dev.uuid)
