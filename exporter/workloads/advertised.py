"""Replicas the device plugins advertise per device: the denominator of time-sliced shares.

A time-sliced or MPS GPU is advertised as several replicas (``GPU-<uuid>::0`` to
``::N-1``, GKE's ``nvidia0/vgpu0`` ...); a pod holding one of four holds a quarter of it,
whether or not others hold the rest. The kubelet's ``GetAllocatableResources`` lists
every advertised device ID, held or not; this module asks it (at most every
``EVERY_S`` seconds, and sooner when the List names a replica it did not list) and
keeps, per device key, the set of replica IDs advertised. A kubelet that does not
answer it (older than 1.23, or the feature gate off) leaves the set unknown: shares then
fall back to the replicas the current holders hold (workloads/usage.py), and the
``gpu_exporter_accounting_share_replicas`` series says which basis was used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimitedLog
from exporter.workloads import ids, limits
from exporter.workloads.kubelet.podresources import KubeletUnavailable, PodResourcesClient

log = logging.getLogger(__name__)

EVERY_S = 60.0
"""Seconds between two asks while nothing changes (a device plugin's sharing config
changes with a restart of the plugin, rarely)."""
SOONEST_S = 5.0
"""Seconds at least between two asks when the List names a replica not advertised."""
MAX_REPLICAS = 1024
"""Replica IDs kept per device (GKE allows 48 clients per GPU, NVIDIA's plugin any number)."""

Advertised = Mapping[str, frozenset[str]]
"""Device key -> the replica IDs advertised for it (devices advertised with replicas only)."""


class AdvertisedReplicas:
    """Asks the kubelet which replicas are advertised; :attr:`replicas` is the last answer
    (empty until one came), swapped whole."""

    def __init__(self, client: PodResourcesClient, wanted: Any) -> None:
        self.client = client
        self.wanted = wanted  # resource name -> whether its devices are GPUs
        self.replicas: Advertised = MappingProxyType({})
        self.status = "not asked yet"
        self._asked_at = float("-inf")
        self._warn = RateLimitedLog(log)

    def due(self, held: Mapping[str, Mapping[Any, tuple[str, ...]]], now: float) -> bool:
        """Whether to ask now: ``held`` (device key -> holder -> replica IDs, the List's)
        names replicas, and the last ask is ``EVERY_S`` old, or ``SOONEST_S`` old while a
        held replica is not among those advertised."""
        if not held:
            return False
        age = now - self._asked_at
        if age >= EVERY_S:
            return True
        if age < SOONEST_S or self.status:
            return False
        got = self.replicas
        return any(
            not set(r) <= got.get(key, frozenset())
            for key, owners in held.items()
            for r in owners.values()
        )

    async def refresh(
        self, gpus: Iterable[Device], instances: Iterable[Device], now: float
    ) -> None:
        """Ask once; on failure keep nothing (shares fall back to the replicas held)."""
        self._asked_at = now
        try:
            raw = await self.client.allocatable_bytes()
            self.replicas = self.parse(raw, ids.Resolver(list(gpus), list(instances)))
        except KubeletUnavailable as e:
            self.replicas = MappingProxyType({})
            if str(e) != self.status:
                self._warn.warning(
                    "%s; time-sliced shares count the replicas their holders hold", e
                )
            self.status = str(e)
            return
        self.status = ""

    def parse(self, raw: bytes, resolver: ids.Resolver) -> Advertised:
        """The replica IDs per device key of an encoded ``AllocatableResourcesResponse``,
        within the bounds of limits.py (entries and IDs past them are not looked at);
        raises KubeletUnavailable when the bytes do not decode."""
        from google.protobuf.message import DecodeError

        from exporter.workloads.kubelet.generated import podresources_pb2 as pb

        try:
            resp = pb.AllocatableResourcesResponse.FromString(raw)
        except DecodeError as e:
            raise KubeletUnavailable(f"kubelet GetAllocatableResources answer: {e}") from None
        out: dict[str, set[str]] = {}
        budget = limits.MAX_DEVICE_IDS
        for entry in resp.devices[: limits.MAX_DEVICE_ENTRIES]:
            name = entry.resource_name
            if len(name) > limits.MAX_NAME_CHARS or not self.wanted(name):
                continue
            for device_id in entry.device_ids[:budget]:
                ref = ids.parse(device_id)
                if ref is None or not ref.replica:
                    continue
                key = resolver.key(ref)
                if key is not None:
                    got = out.setdefault(key, set())
                    if len(got) < MAX_REPLICAS:
                        got.add(ref.replica)
            budget -= min(budget, len(entry.device_ids))
            if budget <= 0:
                break
        return MappingProxyType({k: frozenset(v) for k, v in out.items()})
