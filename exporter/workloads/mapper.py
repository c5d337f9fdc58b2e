"""Device-to-pod map: which container holds each GPU or MIG instance.

Built once per collection interval from the kubelet's ``List`` (never per
scrape) and swapped in whole. A device held by exactly one container gets
that container's labels; a device held by several (time-slicing, MPS) gets
none, and per-container shares are computed for it instead (sharing.py).
The answer is decoded (within the bounds of limits.py: listanswer.py) and
mapped in a worker thread of the mapper's own, so that a large answer never
holds up the event loop and its scrapes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fnmatch
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.frame import Owner, Unhealthy
from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimitedLog
from exporter.workloads import dra, ids, limits
from exporter.workloads.kubelet.podresources import KubeletUnavailable, PodResourcesClient, parse
from exporter.workloads.limits import Drops

log = logging.getLogger(__name__)

NVIDIA_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
MAX_BACKOFF_S = 60.0
GRACE_S = 30.0  # a kubelet restart removes its socket for a moment: keep labels that long
LOGGED_MAX = 1024  # unmatched IDs remembered as logged; MIG churn makes new ones forever
REPLICAS_MAX = 16  # replica IDs kept per container and device (the vgpu label lists them)
REPLICA_CHARS = 32  # a longer replica ID is not kept (NVIDIA and GKE use small numbers)


@dataclass(frozen=True, slots=True)
class PodMap:
    """Owners of each device key; immutable, replaced whole on each refresh."""

    owners: Mapping[str, tuple[Owner, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # device key -> owner -> its replica IDs (``::N``, ``/vgpuN``) of that device, where given
    replicas: Mapping[str, Mapping[Owner, tuple[str, ...]]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    # device key -> the containers holding it while its DRA driver taints it unhealthy
    unhealthy: Mapping[str, tuple[Unhealthy, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def shared(self) -> frozenset[str]:
        return frozenset(k for k, v in self.owners.items() if len(v) > 1)


@dataclass(slots=True)
class _Tally:
    """What building one map counted: device IDs matching no device (by resource),
    items dropped at a bound (by input), and the resource names looked at."""

    unmatched: Counter[str] = field(default_factory=Counter)
    drops: Counter[str] = field(default_factory=Counter)
    wanted: dict[str, bool] = field(default_factory=dict)  # at most MAX_RESOURCE_NAMES
    unhealthy: dict[str, list[Unhealthy]] = field(default_factory=dict)


class Mapper:
    """Refreshes the map from the kubelet, with timeouts and backoff; keeps the last good map.

    Bad input never stops a refresh: device IDs that are malformed or name no
    device here are skipped and counted in ``unmatched`` (by resource, at most
    ``limits.MAX_UNMATCHED_RESOURCES`` names, then ``limits.OTHER``); whatever
    lies past a bound of limits.py is dropped and counted in ``drops``; an
    unexpected error while building the map keeps the last map, counts a
    ``failures`` and sets ``status``. Warnings are rate-limited.
    """

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
        self.reason = "kubelet_not_asked"  # why the map is not current, in a label's words
        self.unmatched: Counter[str] = Counter()  # resource name -> device IDs matching no device
        self.drops = Drops()
        self.failures = 0  # refreshes whose answer could not be mapped
        self._warn = RateLimitedLog(log)
        self._logged: set[str] = set()
        self._retry_at = 0.0
        self._backoff = 1.0
        self._last_ok = float("-inf")
        self.refreshes = 0
        self.rebuilds = 0  # refreshes that built the map (the others reused the last one)
        # ((answer digest, devices), map, tally) of the last build: written by the worker
        # thread, compared on the event loop
        self._cache: tuple[tuple[bytes, tuple[Any, ...]], PodMap, _Tally] | None = None
        self._devs: tuple[tuple[Device, ...], tuple[Any, ...]] = ((), ())  # (objects, fields)
        self._used_slices = False  # the last build looked DRA devices up in ResourceSlices
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def wanted(self, resource_name: str) -> bool:
        """True for the resource names whose devices are GPUs or MIG instances."""
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.patterns)

    async def refresh(self, gpus: Iterable[Device], instances: Iterable[Device]) -> None:
        """Ask the kubelet once (unless backing off) and rebuild the map."""
        now = time.monotonic()
        if now < self._retry_at:
            return
        try:
            raw = await self.client.list_bytes()
        except KubeletUnavailable as e:
            self._fail(str(e), e, now)
            return
        except asyncio.CancelledError:
            raise
        try:
            devs, migs = list(gpus), list(instances)
            # on the event loop: blake2b takes a few ms at most, for a 4 MiB answer
            seen = (hashlib.blake2b(raw, digest_size=16).digest(), self._device_set(devs + migs))
            cache = self._cache
            if cache is not None and cache[0] == seen and not self._used_slices:
                pm, tally = cache[1], cache[2]  # the same answer for the same devices
            else:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(1, "kube-map")
                pm, tally = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._map_for, raw, seen, devs, migs
                )
        except KubeletUnavailable as e:  # the answer does not decode
            self._fail(str(e), e, now)
            return
        except Exception as e:  # a bug, or an answer nobody planned for: keep the last map
            self._cache = None
            self.failures += 1
            self.status = f"kubelet List answer could not be mapped: {type(e).__name__}"
            self.reason = "kubelet_answer_unmapped"
            self._warn.warning("%s: %s; keeping the last pod map", self.status, str(e)[:200])
            return
        self._count(tally)
        self._backoff = 1.0
        self._last_ok = now
        self.refreshes += 1
        if self.status:
            log.info(
                "kubelet pod-resources answering again"
                if self.refreshes > 1
                else "kubelet pod-resources connected"
            )
        self.status = self.reason = ""
        self.map = pm

    def _map_for(
        self,
        raw: bytes,
        seen: tuple[bytes, tuple[Any, ...]],
        gpus: list[Device],
        instances: list[Device],
    ) -> tuple[PodMap, _Tally]:
        """The map for this answer (its bytes; ``seen``: their digest and the devices) and
        what building it counted, in the worker thread. The refresh reuses the last build
        (its skipped and dropped IDs counted again) while ``seen`` is the same."""
        self._cache = None
        resp, dropped = parse(raw)  # only now: an unchanged answer is never decoded again
        self._used_slices = False
        pm, tally = self._build(resp, ids.Resolver(gpus, instances))
        tally.drops.update(dropped)
        self._cache = (seen, pm, tally)
        self.rebuilds += 1
        return pm, tally

    def _count(self, tally: _Tally) -> None:
        """Add what a build counted to the mapper's counters (on the event loop)."""
        for resource, n in tally.unmatched.items():
            known = resource in self.unmatched
            if not known and len(self.unmatched) >= limits.MAX_UNMATCHED_RESOURCES:
                resource = limits.OTHER
            self.unmatched[resource] += n
        for what, n in tally.drops.items():
            self.drops.add(what, n)

    def close(self) -> None:
        """Stop the worker thread (a build in progress finishes on its own)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _device_set(self, devs: list[Device]) -> tuple[Any, ...]:
        """What the answer's IDs are resolved against; last cycle's tuple again while the
        collector hands over the same (immutable) Device objects."""
        last, fields = self._devs
        if len(devs) == len(last) and all(a is b for a, b in zip(devs, last, strict=True)):
            return fields
        fields = _devices(devs)
        self._devs = (tuple(devs), fields)
        return fields

    def _fail(self, why: str, e: KubeletUnavailable, now: float) -> None:
        # the socket missing is a steady state (no kubelet here): check again each interval
        delay = 0.0 if e.missing else self._backoff
        if e.throttled:
            delay = max(delay, 5.0)
        if not e.missing:
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        self._retry_at = now + delay
        if why != self.status:  # a kubelet that flaps between errors: still a few lines a minute
            self._warn.warning(
                "%s; keeping the last pod map%s", why, " and backing off" if delay else ""
            )
        self.status = why
        self.reason = (
            "kubelet_socket_missing"
            if e.missing
            else "kubelet_throttled"
            if e.throttled
            else "kubelet_unavailable"
        )
        if e.missing and now - self._last_ok > GRACE_S:
            self._cache = None
            self.map = PodMap()  # no kubelet for a while: nothing vouches for old labels

    def build(self, resp: Any, resolver: ids.Resolver) -> PodMap:
        """The map from one decoded List answer, its counts added to the mapper's (tests
        call it directly; the answer's bounds are applied while it is decoded)."""
        pm, tally = self._build(resp, resolver)
        self._count(tally)
        return pm

    def _build(self, resp: Any, resolver: ids.Resolver) -> tuple[PodMap, _Tally]:
        owners: dict[str, list[Owner]] = {}
        replicas: dict[str, dict[Owner, list[str]]] = {}
        tally = _Tally()
        for pod in resp.pod_resources:
            for c in pod.containers:
                if not all(
                    len(n) <= limits.MAX_NAME_CHARS for n in (pod.namespace, pod.name, c.name)
                ):
                    tally.drops["kubelet_names"] += 1
                    continue
                owner = Owner(pod.namespace, pod.name, c.name)
                for dev in c.devices:
                    if self._wanted(dev.resource_name, tally):
                        for device_id in dev.device_ids:
                            key = self._resolve(resolver, dev.resource_name, device_id, tally)
                            if key is not None:
                                owners.setdefault(key, []).append(owner)
                                _note_replica(replicas, key, owner, device_id)
                self._claims(pod, c, resolver, owners, tally)
        frozen = {k: tuple(dict.fromkeys(v)) for k, v in owners.items()}
        reps = {
            k: MappingProxyType({o: tuple(r) for o, r in v.items()}) for k, v in replicas.items()
        }
        sick = {k: tuple(dict.fromkeys(v)) for k, v in tally.unhealthy.items()}
        pm = PodMap(MappingProxyType(frozen), MappingProxyType(reps), MappingProxyType(sick))
        return pm, tally

    def _wanted(self, resource: str, tally: _Tally) -> bool:
        known = tally.wanted.get(resource)
        if known is not None:
            return known
        if len(tally.wanted) >= limits.MAX_RESOURCE_NAMES or len(resource) > limits.MAX_NAME_CHARS:
            tally.drops["resource_names"] += 1
            return False
        tally.wanted[resource] = self.wanted(resource)
        return tally.wanted[resource]

    def _claims(
        self,
        pod: Any,
        c: Any,
        resolver: ids.Resolver,
        owners: dict[str, list[Owner]],
        tally: _Tally,
    ) -> None:
        for dr in c.dynamic_resources:
            if max(len(dr.claim_name), len(dr.claim_namespace)) > limits.MAX_NAME_CHARS:
                tally.drops["kubelet_names"] += 1
                continue
            for cr in dr.claim_resources:
                if cr.driver_name != dra.DRIVER:
                    continue
                if max(len(cr.pool_name), len(cr.device_name)) > limits.MAX_NAME_CHARS:
                    tally.drops["kubelet_names"] += 1
                    continue
                key, dev = self._dra_key(resolver, cr, tally)
                if key is not None:
                    o = dra.claim_owner(Owner(pod.namespace, pod.name, c.name), dr, cr, key, dev)
                    owners.setdefault(key, []).append(o)
                    sick = [Unhealthy(o, "taint", r) for r in dra.unhealthy_taints(dev)]
                    if sick:
                        tally.unhealthy.setdefault(key, []).extend(sick)

    def _resolve(
        self, resolver: ids.Resolver, resource: str, device_id: str, tally: _Tally
    ) -> str | None:
        ref = ids.parse(device_id)
        key = resolver.key(ref) if ref is not None else None
        if key is None:
            tally.unmatched[resource] += 1
            if device_id not in self._logged:
                self._remember(device_id)
                why = "unknown ID form" if ref is None else "no such GPU or MIG instance here"
                self._warn.warning(
                    "device ID %s of %s matches no device (%s)",
                    _short(device_id),
                    _short(resource),
                    why,
                )
        return key

    def _remember(self, device_id: str) -> None:
        """Note an ID as logged; past LOGGED_MAX the memory starts over (an ID may be logged
        again, once) so that IDs of instances long gone do not pile up."""
        if len(self._logged) >= LOGGED_MAX:
            self._logged.clear()
        self._logged.add(device_id[: limits.MAX_DEVICE_ID_CHARS])

    def _dra_key(self, resolver: ids.Resolver, cr: Any, tally: _Tally) -> tuple[str | None, Any]:
        """The device key of a claim's device, and its ResourceSlice device (or None)."""
        self._used_slices = True  # slices change without the kubelet's answer changing
        dev = (
            self.slice_device(cr.driver_name, cr.pool_name, cr.device_name)
            if self.slice_device
            else None
        )
        resource = "dra:" + cr.driver_name
        if dev is not None and dev.uuid:
            return self._resolve(resolver, resource, dev.uuid, tally), dev
        key, why = dra.dynamic_mig(resolver, dev)
        if key is not None:
            return key, dev
        tally.unmatched[resource] += 1
        name = f"{cr.pool_name}/{cr.device_name}"
        if name not in self._logged:
            self._remember(name)
            self._warn.warning(
                "DRA device %s matches no GPU or MIG instance (%s); left unattributed",
                _short(name),
                why,
            )
        return None, dev


def _note_replica(
    replicas: dict[str, dict[Owner, list[str]]], key: str, owner: Owner, device_id: str
) -> None:
    """Remember the replica ID of a shared device's ID (``GPU-...::2``, ``nvidia0/vgpu2``)."""
    if "::" not in device_id and "/vgpu" not in device_id:
        return
    ref = ids.parse(device_id)
    if ref is not None and ref.replica and len(ref.replica) <= REPLICA_CHARS:
        got = replicas.setdefault(key, {}).setdefault(owner, [])
        if ref.replica not in got and len(got) < REPLICAS_MAX:
            got.append(ref.replica)


def _devices(devs: list[Device]) -> tuple[Any, ...]:
    """What the device IDs in a kubelet answer are resolved against (ids.Resolver)."""
    return tuple((d.key, d.uuid, d.gi, d.ci, d.profile, d.labels) for d in devs)


def _short(text: str, n: int = 80) -> str:
    """``repr`` of ``text``, cut to about ``n`` characters for a log line."""
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text)} chars)"
