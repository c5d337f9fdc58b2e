"""This node's pods (and DRA ResourceSlices and ResourceClaims) from the API server.

One list-then-watch per resource (reflector.py), with a field selector on
this node, so memory is bounded by the node's pods and the API server's load
does not grow with scrapes. Pods go into a PodIndex (podindex.py: UIDs,
containers, copied labels), ResourceSlices into a SliceIndex (slices.py), and
ResourceClaims, of the whole cluster (claims have no node field to select on), into
a ClaimIndex (claims.py) that keeps only those sharing a device by consumed capacity.
Readers get immutable snapshots, so lookups from other threads take no lock.

RBAC: get, list and watch on pods; with DRA also on resourceslices and
resourceclaims (resource.k8s.io) and get on the discovery path /apis/resource.k8s.io
(allowed to every authenticated user by default).

Requests go through apiclient.py; the configuration is read when a watcher starts.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from typing import Any

from exporter.workloads.apiserver.apiclient import ApiError
from exporter.workloads.apiserver.claims import ClaimIndex, Consumed
from exporter.workloads.apiserver.podindex import (
    LabelPolicy,
    PodIndex,
    PodInfo,
    sanitize_label_name,
)
from exporter.workloads.apiserver.reflector import (
    Lister,
    Reflector,
    Timing,
    default_api_client,
    read_json,
)
from exporter.workloads.apiserver.slices import SliceDevice, SliceIndex
from exporter.workloads.limits import Drops

__all__ = ["PodInfo", "PodWatcher", "SliceDevice", "Timing", "sanitize_label_name"]

DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preferred first; v1 since Kubernetes 1.34
PODS_PATH = "/api/v1/pods"
GROUP_PATH = "/apis/resource.k8s.io"


class PodWatcher:
    """Watches this node's pods, and with ``dra`` the node's ResourceSlices."""

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,
        label_allow: str | None = None,
        copy_labels: bool = False,
        label_allowlist: Iterable[str] = (),
        dra: bool = False,
        timing: Timing | None = None,
    ) -> None:
        """``api_client`` None: in-cluster configuration, else KUBECONFIG or
        ~/.kube/config. ``label_allow``: regular expression that must match a
        pod label's whole name for it to be copied as ``label_<name>``; None
        copies none this way. ``copy_labels``: copy pod labels under their
        sanitized names (dcgm-exporter's way), those that ``label_allowlist``
        (regular expressions, any may match; empty: all) allows. Raises
        ValueError for an empty node name or a bad expression."""
        if not node_name:
            raise ValueError("node name is empty: set NODE_NAME (the downward API's spec.nodeName)")
        self.drops = Drops()
        self.index = PodIndex(LabelPolicy(label_allow, copy_labels, label_allowlist), self.drops)
        self.slices = SliceIndex(self.drops)
        self.claims = ClaimIndex(self.drops)
        self.node_name = node_name
        self.dra = dra
        self.timing = timing or Timing()
        self._api_client = api_client
        self._own_client = api_client is None
        self._client_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reflectors: list[Reflector] = []

    # -- reads (any thread, no lock) --

    def pod(self, uid: str) -> PodInfo | None:
        """The pod with this UID (or, for a static pod, its cgroup UID); None if unknown."""
        return self.index.pod(uid)

    def pod_by_name(self, namespace: str, name: str) -> PodInfo | None:
        """The pod with this namespace and name; None if unknown."""
        return self.index.pod_by_name(namespace, name)

    def pods(self) -> list[PodInfo]:
        """Every pod on this node, as of the last event (at most ``limits.MAX_PODS``)."""
        return self.index.pods()

    def slice_device(self, driver: str, pool: str, name: str) -> SliceDevice | None:
        """The device a DRA claim names, from the pool's newest generation; None if
        unknown or DRA is off."""
        return self.slices.device(driver, pool, name)

    def claim_consumed(
        self, namespace: str, name: str, device: tuple[str, str, str]
    ) -> Consumed | None:
        """What claim ``namespace/name`` consumes of the (driver, pool, name) device, by
        capacity name; None if unknown, not shared by capacity, or DRA is off."""
        return self.claims.consumed(namespace, name, device)

    @property
    def synced(self) -> bool:
        """True once every watched resource was listed at least once."""
        return bool(self._reflectors) and all(r.synced for r in self._reflectors)

    @property
    def pods_synced(self) -> bool:
        """True once the pods were listed: lookups answer from then on, from the last
        good data while the API server is away (``status`` says so)."""
        return bool(self._reflectors) and self._reflectors[0].synced

    @property
    def status(self) -> str:
        """Empty when every watch is healthy and synced; else what is wrong, one part each."""
        if not self._reflectors:
            return "pod watch not started"
        return "; ".join(s for s in (r.status for r in self._reflectors) if s)

    # -- lifecycle --

    def start(self) -> None:
        """Start the watch threads; problems reaching the API server only show in ``status``."""
        if self._threads:
            return
        self._stop = threading.Event()  # a thread left over from a slow stop() keeps its own
        pods = Reflector(
            "pods", f"spec.nodeName={self.node_name}", self._pods_api, self.index.replace,
            self.index.event, self._stop, self.timing, self.drops,
        )  # fmt: skip
        self._reflectors = [pods]
        if self.dra:
            slices = Reflector(
                "ResourceSlices", f"spec.nodeName={self.node_name}", self._slices_api,
                self.slices.replace, self.slices.event, self._stop, self.timing, self.drops,
            )  # fmt: skip
            claims = Reflector(
                "ResourceClaims", "", functools.partial(self._dra_api, "resourceclaims"),
                self.claims.replace, self.claims.event, self._stop, self.timing, self.drops,
            )  # fmt: skip
            self._reflectors += [slices, claims]
        for r in self._reflectors:
            t = threading.Thread(target=r.run, name=f"watch-{r.what}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the threads, aborting open requests; returns within about 2 s."""
        self._stop.set()
        for r in self._reflectors:
            r.abort()
        deadline = time.monotonic() + 2.0
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = any(t.is_alive() for t in self._threads)
        self._threads = []
        if self._own_client and self._api_client is not None and not alive:
            self._api_client.close()
            self._api_client = None

    # -- API plumbing (watch threads) --

    def _client(self) -> Any:
        """The API client, made on first use (reading the configuration, kept off
        the caller's thread)."""
        with self._client_lock:
            if self._api_client is None:
                self._api_client = default_api_client()
            return self._api_client

    def _pods_api(self) -> Lister:
        return functools.partial(self._client().get, PODS_PATH)

    def _slices_api(self) -> Lister:
        return self._dra_api("resourceslices")

    def _dra_api(self, resource: str) -> Lister:
        """The list function of ``resource`` in the newest resource.k8s.io version both
        sides know."""
        api = self._client()
        t = self.timing
        try:
            resp = api.get(GROUP_PATH, timeout=(t.connect_timeout_s, t.list_timeout_s))
        except ApiError as e:
            if e.status == 404:
                raise RuntimeError("resource.k8s.io is not served by this API server") from e
            raise
        group = read_json(resp)
        versions = group.get("versions")
        served = (
            {v.get("version") for v in versions if isinstance(v, dict)}
            if isinstance(versions, list)
            else set()
        )
        for version in DRA_VERSIONS:
            if version in served:
                return functools.partial(api.get, f"{GROUP_PATH}/{version}/{resource}")
        raise RuntimeError(
            f"resource.k8s.io serves {sorted(str(v) for v in served if v)}; this exporter "
            f"reads {', '.join(DRA_VERSIONS)}"
        )
