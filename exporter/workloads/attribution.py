"""Pod attribution for the poller: kubelet map, optional API-server watch, shared-GPU splits.

The poller calls :meth:`Attribution.refresh` once per cycle, right after the
collection, then hands :meth:`holders` and :meth:`splits` (plain records) to
the exposition. Host PIDs on shared devices are joined to pods here, on the
cycle's data, never from inside the NVML thread. The API
server is watched only when something needs it (pod UIDs or labels, DRA, or
joining processes on shared GPUs to pods): a node that needs none of them
keeps no watch thread and no API-server connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from exporter.config.model import KubeConfig
from exporter.frame import (
    DeviceUse,
    Holder,
    HolderKey,
    KubeStatus,
    Owner,
    Split,
    Unhealthy,
    Window,
)
from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimitedLog
from exporter.snapshot import Snapshot, Value
from exporter.workloads.advertised import AdvertisedReplicas
from exporter.workloads.capacity import claim_parts
from exporter.workloads.cgroups import ContainerRef, container_of
from exporter.workloads.kubelet.podresources import PodResourcesClient
from exporter.workloads.limits import Drops
from exporter.workloads.mapper import Mapper, PodMap
from exporter.workloads.sharing import split_shared
from exporter.workloads.sightings import Sightings
from exporter.workloads.usage import Usage, shares, wants_processes

log = logging.getLogger(__name__)

STALE_S = 10.0
"""Seconds (of the collector's clock) the last good kubelet answer is charged for while
the kubelet does not answer; after that, accounting charges attribution unknown."""


class Attribution:
    """Owns the kubelet client, the mapper and (lazily) the API-server pod watcher."""

    def __init__(self, cfg: KubeConfig, watcher: Any = None) -> None:
        self.cfg = cfg
        self.client = PodResourcesClient(cfg.socket, cfg.timeout_s)
        self.mapper = Mapper(self.client, cfg.resource_names, self._slice_device)
        self.advertised = AdvertisedReplicas(self.client, self.mapper.wanted)
        self.watcher = watcher
        self._watcher_failed = ""
        self._holders: Mapping[str, Holder] = MappingProxyType({})
        self._sharers: Mapping[str, tuple[Holder, ...]] = MappingProxyType({})
        # host PID -> (its /proc entry is visible, its container)
        self._containers: dict[int, tuple[bool, ContainerRef | None]] = {}
        self.duration = 0.0
        self._usage = Usage()
        self._turn = 0  # cycles asked which process lists to read
        self._good_at: float | None = None  # collector time of the last current map
        self._warn = RateLimitedLog(log)
        self.sightings = Sightings(self._api_times)
        self._devices: tuple[Sequence[Device], Sequence[Device]] | None = None  # the last cycle's
        if cfg.pod_uid or cfg.pod_labels or cfg.dcgm_pod_labels or cfg.dra:
            self._start_watcher()

    # --- API server -------------------------------------------------------
    def _start_watcher(self) -> None:
        if self.watcher is not None or self._watcher_failed:
            return
        try:
            from exporter.workloads.apiserver.watch import PodWatcher

            self.watcher = PodWatcher(
                self.cfg.node_name,
                label_allow=self.cfg.pod_labels,
                copy_labels=self.cfg.dcgm_pod_labels,
                label_allowlist=self.cfg.pod_label_allowlist,
                dra=self.cfg.dra,
            )
            self.watcher.start()
        except (ValueError, ImportError) as e:  # bad arguments, or a module missing
            self._watcher_failed = f"API server not usable: {e}"
            log.warning("%s; pod UIDs, labels, DRA and shared-GPU splits are off", e)

    def _slice_device(self, driver: str, pool: str, name: str) -> Any:
        return self.watcher.slice_device(driver, pool, name) if self.watcher else None

    # --- per cycle --------------------------------------------------------
    async def refresh(self, snap: Snapshot) -> None:
        """Rebuild the device map against the devices of ``snap``; never raises
        (a failure keeps the last labels, and is counted and logged)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await self._refresh(snap)
        except Exception as e:  # the cycle's GPU series are published all the same
            self.mapper.failures += 1
            self.mapper.status = f"kube mapping failed: {type(e).__name__}"
            self.mapper.reason = "mapping_failed"
            self._warn.warning("%s: %s; keeping the last pod labels", self.mapper.status, e)
        self.duration = loop.time() - t0

    async def sight(self, now: float) -> None:
        """Ask the kubelet between cycles who holds what (at ``now``, the collector's unix
        seconds), for holders' start and end times only (sightings.py); never raises."""
        if self._devices is None:
            return
        try:
            await self._ask(*self._devices, now)
        except Exception as e:  # the next cycle asks again
            self._warn.warning("kubelet asked between cycles: %s: %s", type(e).__name__, e)

    async def _ask(self, gpus: Sequence[Device], instances: Sequence[Device], now: float) -> None:
        """Ask the kubelet's List and map it; record who it lists (when it answered)."""
        try:
            await asyncio.wait_for(self.mapper.refresh(gpus, instances), self.cfg.timeout_s + 1)
        except TimeoutError:
            self.mapper.status = "kubelet did not answer in time"
            self.mapper.reason = "kubelet_timeout"
        if not self.mapper.status:
            self.sightings.see(self.mapper.map.owners, self._shares_now(), now)

    def _shares_now(self) -> Callable[[str, Owner], float]:
        """A holder's share of its device in the current map, each device's shares worked
        out once (a device's new holders in one answer may be thousands)."""
        pm = self.mapper.map
        by_key: dict[str, dict[Owner, float]] = {}  # the first of a repeated holder counts

        def share(key: str, owner: Owner) -> float:
            if key not in by_key:
                holders = pm.owners[key]
                reps, ads = pm.replicas.get(key, {}), self.advertised.replicas.get(key)
                parts = shares(holders, reps, ads)[0]
                by_key[key] = dict(zip(reversed(holders), reversed(parts), strict=True))
            return by_key[key][owner]

        return share

    def _api_times(self, owner: Owner) -> tuple[float | None, float | None]:
        info = self.watcher.pod_by_name(owner.namespace, owner.pod) if self.watcher else None
        return info.times.get(owner.container, (None, None)) if info is not None else (None, None)

    def windows(self) -> dict[HolderKey, Window]:
        """When holders began or stopped holding their devices since the last call."""
        return self.sightings.take()

    async def _refresh(self, snap: Snapshot) -> None:
        instances = [d for d in snap.entities if d.is_mig]
        # down GPUs too: a GPU that fell off the bus keeps its pod on its XID counter
        self._devices = (snap.gpus + snap.down, instances)
        await self._ask(snap.gpus + snap.down, instances, snap.taken_at)
        pm = self.mapper.map
        now = asyncio.get_running_loop().time()
        if not self.mapper.status and self.advertised.due(pm.replicas, now):
            try:
                await asyncio.wait_for(
                    self.advertised.refresh(snap.gpus, instances, now),
                    self.cfg.timeout_s + 1,
                )
            except TimeoutError:
                self.advertised.status = "kubelet GetAllocatableResources did not answer in time"
        if pm.shared:
            self._start_watcher()  # joining processes to pods needs pod UIDs
        holders, sharers = self._build_holders(pm)
        # unchanged holders stay the same objects, so the exposition keeps its label text
        if holders != self._holders:
            self._holders = holders
        if sharers != self._sharers:
            self._sharers = sharers

    def unknown(self, now: float) -> str:
        """Why who holds what is not known at ``now`` (the collector's unix seconds): the
        kubelet has not answered for more than ``STALE_S`` (from the first call on);
        "" while its map is current enough to charge."""
        if self._good_at is None or not self.mapper.status:
            self._good_at = now
        if not self.mapper.status or now - self._good_at <= STALE_S:
            return ""
        return self.mapper.reason  # set with every status (mapper.py)

    @property
    def joinable(self) -> bool:
        """Whether host PIDs can be joined to pods (the API server's pods are listed)."""
        return self.watcher is not None and self.watcher.pods_synced

    def wants_processes(self) -> Callable[[str, Mapping[str, Value]], bool]:
        """Which devices' processes the collector reads this cycle (workloads/usage.py)."""
        self._turn += 1
        trusted = not self.mapper.status
        return wants_processes(self.mapper.map, self.joinable, self._turn, trusted)

    def usage(self, snap: Snapshot) -> Mapping[str, DeviceUse]:
        """Holders and unaccounted processes of every device of ``snap``, for accounting
        (none unaccounted while the kubelet's answer is not current)."""
        whose = self._whose if self.joinable else None
        pm = self.mapper.map
        parts = {}  # devices several DRA claims share: split by consumed capacity
        if self.cfg.dra and self.watcher is not None:
            parts = claim_parts(pm.owners, self.watcher.claim_consumed, self._slice_device)
        return self._usage.uses(
            snap, pm, whose, not self.mapper.status, self.advertised.replicas, parts
        )

    def holders(self) -> Mapping[str, Holder]:
        """The container holding each device that exactly one container holds."""
        return self._holders

    def unhealthy(self) -> Mapping[str, tuple[Unhealthy, ...]]:
        """The containers holding each device their DRA driver calls unhealthy: by a
        ResourceSlice taint (the mapper), or by their pod's allocatedResourcesStatus, whose
        entry names the claim (``claim:<claim>/<request>``) and the device
        (``<driver>/<pool>/<device>``)."""
        pm = self.mapper.map
        if self.watcher is None:
            return pm.unhealthy
        out = {k: list(v) for k, v in pm.unhealthy.items()}
        for key, owners in pm.owners.items():
            for o in owners:
                info = self.watcher.pod_by_name(o.namespace, o.pod) if o.claim else None
                device = f"{o.driver}/{o.pool}/{o.device}"
                for container, resource, rid in info.unhealthy if info is not None else ():
                    if (container, rid) == (o.container, device) and resource.startswith(
                        f"claim:{o.claim}/"
                    ):
                        out.setdefault(key, []).append(Unhealthy(o, "pod_status", "Unhealthy"))
        return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}

    def sharers(self) -> Mapping[str, tuple[Holder, ...]]:
        """With --kubernetes-virtual-gpus, the containers holding each device that several
        hold (in the kubelet's order); empty without the flag."""
        return self._sharers

    def _holder(self, o: Owner, vgpu: str = "") -> Holder:
        info = self.watcher.pod_by_name(o.namespace, o.pod) if self.watcher else None
        uid = info.uid if (info is not None and self.cfg.pod_uid) else ""
        labels = tuple(info.labels.items()) if info is not None else ()  # as copied
        return Holder(o, uid, labels, vgpu)

    def _build_holders(
        self, pm: PodMap
    ) -> tuple[Mapping[str, Holder], Mapping[str, tuple[Holder, ...]]]:
        one, several = {}, {}
        for key, owners in pm.owners.items():
            if len(owners) == 1:
                one[key] = self._holder(owners[0])
            elif self.cfg.virtual_gpus:
                reps = pm.replicas.get(key, {})
                several[key] = tuple(self._holder(o, ",".join(reps.get(o, ()))) for o in owners)
        return MappingProxyType(one), MappingProxyType(several)

    def splits(self, snap: Snapshot) -> list[Split]:
        """Per-container shares of the shared devices of ``snap`` (PIDs joined to pods here)."""
        live = {p.pid for ps in snap.processes.values() for p in ps}
        for pid in [p for p in self._containers if p not in live]:
            del self._containers[pid]  # PIDs get reused
        return split_shared(snap, self.mapper.map, self._owner_of if self.joinable else None)

    def _owner_of(self, pid: int) -> Owner | None:
        return self._whose(pid)[1]

    def _whose(self, pid: int) -> tuple[bool, Owner | None]:
        """(known, owner) of a host PID: known False when the join cannot tell (its /proc
        entry is not visible, its container not yet listed); owner None when it runs in
        no pod or in a pod the API server does not know (a deleted pod's leftover)."""
        got = self._containers.get(pid)
        if got is None:
            ref = container_of(pid, self.cfg.host_proc)
            visible = ref is not None or os.path.isdir(os.path.join(self.cfg.host_proc, str(pid)))
            got = self._containers[pid] = (visible, ref)
        visible, ref = got
        if ref is None:  # called only while joinable: the watcher is there
            return visible, None
        info = self.watcher.pod(ref.pod_uid)
        if info is None:
            return True, None
        name = info.containers.get(ref.container_id)
        return (True, Owner(info.namespace, info.name, name)) if name else (False, None)

    # --- status -----------------------------------------------------------
    def details(self) -> list[str]:
        """Lines for /ready's details (attribution problems never make the exporter unready)."""
        out = []
        if self.mapper.status:
            out.append(f"pod labels off: {self.mapper.status}")
        if self._watcher_failed:
            out.append(self._watcher_failed)
        elif self.watcher is not None and self.watcher.status:
            out.append(self.watcher.status)
        return out

    def status(self) -> KubeStatus:
        """Reachability, unmatched IDs and held devices, for the self-metrics."""
        api = None
        if self.watcher is not None or self._watcher_failed:
            api = self.watcher is not None and not self.watcher.status
        counts = Counter(dict(self.mapper.drops.items()))
        drops: Drops | None = getattr(self.watcher, "drops", None)
        counts.update(dict(drops.items()) if drops is not None else {})
        return KubeStatus(
            not self.mapper.status,
            api,
            tuple(sorted(self.mapper.unmatched.items())),
            len(self.mapper.map.owners),
            tuple(sorted(counts.items())),
            self.mapper.failures,
        )

    async def close(self) -> None:
        self.mapper.close()
        await self.client.close()
        if self.watcher is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.watcher.stop)
