"""Pod attribution for the poller: kubelet map, optional API-server watch, shared-GPU series.

The poller calls :meth:`Attribution.refresh` once per cycle, right after the
collection, and renders with :meth:`labels` and :meth:`render_shared`. The API
server is watched only when something needs it (pod UIDs or labels, DRA, or
joining processes on shared GPUs to pods); importing and starting it is
deferred until then, since the kubernetes client costs ~20 MiB.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.config import KubeConfig
from exporter.kube.cgroups import container_of
from exporter.kube.limits import Drops, RateLimitedLog
from exporter.kube.mapper import Mapper, Owner, PodMap, owner_labels
from exporter.kube.podresources import PodResourcesClient
from exporter.kube.sharing import render_shared
from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)


class Attribution:
    """Owns the kubelet client, the mapper and (lazily) the API-server pod watcher."""

    def __init__(self, cfg: KubeConfig, watcher: Any = None) -> None:
        self.cfg = cfg
        self.client = PodResourcesClient(cfg.socket, cfg.timeout_s)
        self.mapper = Mapper(self.client, cfg.resource_names, self._slice_device)
        self.watcher = watcher
        self._watcher_failed = ""
        self._labels: Mapping[str, str] = MappingProxyType({})
        self._map_seen: PodMap | None = None
        self.duration = 0.0
        self._warn = RateLimitedLog(log)
        if cfg.pod_uid or cfg.pod_labels or cfg.dcgm_pod_labels or cfg.dra:
            self._start_watcher()

    # --- API server -------------------------------------------------------
    def _start_watcher(self) -> None:
        if self.watcher is not None or self._watcher_failed:
            return
        try:
            from exporter.kube.apiserver import PodWatcher

            self.watcher = PodWatcher(
                self.cfg.node_name,
                label_allow=self.cfg.pod_labels,
                copy_labels=self.cfg.dcgm_pod_labels,
                label_allowlist=self.cfg.pod_label_allowlist,
                dra=self.cfg.dra,
            )
            self.watcher.start()
        except (ValueError, ImportError) as e:  # bad arguments, or no kubernetes package
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
            self._warn.warning("%s: %s; keeping the last pod labels", self.mapper.status, e)
        self.duration = loop.time() - t0

    async def _refresh(self, snap: Snapshot) -> None:
        instances = [d for d in snap.entities if d.is_mig]
        try:
            await asyncio.wait_for(
                # down GPUs too: a GPU that fell off the bus keeps its pod on its XID counter
                self.mapper.refresh(snap.gpus + snap.down, instances),
                self.cfg.timeout_s + 1,
            )
        except TimeoutError:
            self.mapper.status = "kubelet did not answer in time"
        pm = self.mapper.map
        if pm.shared:
            self._start_watcher()  # joining processes to pods needs pod UIDs
        self._labels = self._build_labels(pm)

    def shared_keys(self) -> frozenset[str]:
        """Devices held by several containers: the collector reads their processes."""
        return self.mapper.map.shared

    def resolve_pid(self, pid: int) -> Any:
        """Container of a host PID (called from the NVML worker thread)."""
        return container_of(pid, self.cfg.host_proc)

    def labels(self) -> Mapping[str, str]:
        """Label text per device key held by exactly one container."""
        return self._labels

    def _build_labels(self, pm: PodMap) -> Mapping[str, str]:
        out = {}
        for key, owners in pm.owners.items():
            if len(owners) != 1:
                continue
            o = owners[0]
            info = self.watcher.pod_by_name(o.namespace, o.pod) if self.watcher else None
            uid = info.uid if (info is not None and self.cfg.pod_uid) else ""
            extra = info.labels if info is not None else None  # empty unless labels are copied
            out[key] = owner_labels(o, uid, extra)
        return MappingProxyType(out)

    def render_shared(self, snap: Snapshot) -> tuple[str, int]:
        joinable = self.watcher is not None and self.watcher.pods_synced
        return render_shared(snap, self.mapper.map, self._owner_of if joinable else None)

    def _owner_of(self, ref: Any) -> Owner | None:
        if ref is None or self.watcher is None:
            return None
        info = self.watcher.pod(ref.pod_uid)
        if info is None:
            return None
        name = info.containers.get(ref.container_id)
        return Owner(info.namespace, info.name, name) if name else None

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

    def families(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpu_exporter_kubelet_up",
            "1 when the last pod-resources List succeeded.",
            int(not self.mapper.status),
        )
        yield up
        if self.watcher is not None or self._watcher_failed:
            yield GaugeMetricFamily(
                "gpu_exporter_kube_api_up",
                "1 when the API-server watch is synced.",
                int(self.watcher is not None and not self.watcher.status),
            )
        un = CounterMetricFamily(
            "gpu_exporter_unmatched_device_ids",
            "Device IDs from the kubelet that matched no GPU or MIG instance, by resource.",
            labels=["resource"],
        )
        for resource, n in sorted(self.mapper.unmatched.items()):
            un.add_metric([resource], n)
        yield un
        yield from self._input_families()
        yield GaugeMetricFamily(
            "gpu_exporter_attributed_devices",
            "GPUs and MIG instances held by at least one container.",
            len(self.mapper.map.owners),
        )

    def _input_families(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "gpu_exporter_kube_inputs_dropped",
            "Items of kubelet or API-server answers dropped at a bound or as invalid, by input.",
            labels=["input"],
        )
        counts = Counter(dict(self.mapper.drops.items()))
        drops: Drops | None = getattr(self.watcher, "drops", None)
        counts.update(dict(drops.items()) if drops is not None else {})
        for what, n in sorted(counts.items()):
            dropped.add_metric([what], n)
        yield dropped
        yield CounterMetricFamily(
            "gpu_exporter_kube_mapping_failures",
            "Cycles whose pod mapping failed; the last good pod labels stayed in use.",
            self.mapper.failures,
        )

    async def close(self) -> None:
        await self.client.close()
        if self.watcher is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.watcher.stop)
