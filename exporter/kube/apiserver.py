"""This node's pods (and DRA ResourceSlices) from the API server, held in memory.

One list-then-watch per resource, with a field selector on this node, so memory
is bounded by the node's pods and the API server's load does not grow with
scrapes. Readers get immutable snapshots (dicts swapped whole, never mutated),
so lookups from other threads take no lock.

Each watch runs in a thread of its own: list (remember metadata.resourceVersion),
watch from there with ``timeoutSeconds`` and a socket read timeout a little
longer, so a dead connection is noticed; when a watch ends or breaks, watch
again from the last resourceVersion seen; on 410 Gone (HTTP status or ERROR
event) list again. Failures are retried with exponential backoff capped at 30 s
while the last good data stays in use, and ``status`` says what is wrong.

RBAC: get, list and watch on pods; with DRA also on resourceslices
(resource.k8s.io) and get on the discovery path /apis/resource.k8s.io
(allowed to every authenticated user by default).

``kubernetes`` is imported only when a watcher starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

log = logging.getLogger(__name__)

DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preferred first; v1 since Kubernetes 1.34
_SLICE_APIS = {v: f"Resource{v.capitalize()}Api" for v in DRA_VERSIONS}  # kubernetes.client
_MIRROR = "kubernetes.io/config.mirror"  # a static pod's UID (as in its cgroup) on its mirror pod
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod on this node. ``containers`` maps container ID (no ``containerd://``
    prefix) to container name for every container that has started, init and
    ephemeral ones included; ``labels`` holds the allowed pod labels under their
    Prometheus names (``label_<sanitized name>``)."""

    uid: str
    name: str
    namespace: str
    containers: Mapping[str, str]
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device published in a ResourceSlice; attributes absent on it are ""."""

    driver: str
    pool: str
    name: str
    type: str
    uuid: str
    parent_uuid: str
    profile: str


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds. Retries wait 50-100 % of a delay that doubles from
    ``backoff_initial_s`` to ``backoff_max_s``. Watches last ``watch_timeout_s``
    to 1.5 times that (spread so that a fleet of exporters does not reconnect at
    once); reads time out ``read_grace_s`` after that."""

    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    watch_timeout_s: int = 300
    read_grace_s: float = 30.0
    connect_timeout_s: float = 10.0
    list_timeout_s: float = 60.0


def sanitize_label_name(name: str) -> str:
    """Prometheus label name for a pod label, as kube-state-metrics names it:
    ``app.kubernetes.io/name`` -> ``label_app_kubernetes_io_name``."""
    return "label_" + _INVALID_LABEL_CHARS.sub("_", name)


class _Gone(Exception):
    """The resourceVersion we hold has been compacted away: list again."""


class PodWatcher:
    """Watches this node's pods, and with ``dra`` the node's ResourceSlices."""

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,
        label_allow: str | None = None,
        dra: bool = False,
        timing: Timing | None = None,
    ) -> None:
        """``api_client`` None: in-cluster configuration, else KUBECONFIG or
        ~/.kube/config. ``label_allow``: regular expression that must match a
        pod label's whole name for it to be kept; None keeps none. Raises
        ValueError for an empty node name or a bad expression."""
        if not node_name:
            raise ValueError("node name is empty: set NODE_NAME (the downward API's spec.nodeName)")
        try:
            self._allow = re.compile(label_allow) if label_allow else None
        except re.error as e:
            raise ValueError(f"pod label allow-list {label_allow!r} is not a regex: {e}") from e
        self.node_name = node_name
        self.dra = dra
        self.timing = timing or Timing()
        self._api_client = api_client
        self._own_client = api_client is None
        self._client_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Snapshots, each replaced whole by the watch threads.
        self._pods: tuple[Mapping[str, PodInfo], Mapping[tuple[str, str], PodInfo]] = ({}, {})
        self._slices: dict[str, tuple[str, str, int, tuple[SliceDevice, ...]]] = {}
        self._devices: Mapping[tuple[str, str, str], SliceDevice] = {}
        self._reflectors: list[_Reflector] = []

    # -- reads (any thread, no lock) --

    def pod(self, uid: str) -> PodInfo | None:
        """The pod with this UID (or, for a static pod, its cgroup UID); None if unknown."""
        return self._pods[0].get(uid)

    def pod_by_name(self, namespace: str, name: str) -> PodInfo | None:
        """The pod with this namespace and name; None if unknown."""
        return self._pods[1].get((namespace, name))

    def pods(self) -> list[PodInfo]:
        """Every pod on this node, as of the last event."""
        return list(self._pods[1].values())

    def slice_device(self, driver: str, pool: str, name: str) -> SliceDevice | None:
        """The device a DRA claim names, from the pool's newest generation; None if
        unknown or DRA is off."""
        return self._devices.get((driver, pool, name))

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
        pods = _Reflector(
            "pods", f"spec.nodeName={self.node_name}", self._pods_api, self._replace_pods,
            self._pod_event, self._stop, self.timing,
        )  # fmt: skip
        self._reflectors = [pods]
        if self.dra:
            slices = _Reflector(
                "ResourceSlices", f"spec.nodeName={self.node_name}", self._slices_api,
                self._replace_slices, self._slice_event, self._stop, self.timing,
            )  # fmt: skip
            self._reflectors.append(slices)
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
        """The API client, made on first use (reading the configuration, importing
        kubernetes: about 2 s, kept off the caller's thread)."""
        with self._client_lock:
            if self._api_client is None:
                self._api_client = _default_api_client()
            return self._api_client

    def _pods_api(self) -> Callable[..., Any]:
        api = self._client()
        from kubernetes import client

        return client.CoreV1Api(api).list_pod_for_all_namespaces

    def _slices_api(self) -> Callable[..., Any]:
        """The list function of the newest resource.k8s.io version both sides know."""
        api = self._client()
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            resp = client.ResourceApi(api).get_api_group(
                _preload_content=False, _request_timeout=self.timing.list_timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                raise RuntimeError("resource.k8s.io is not served by this API server") from e
            raise
        group = _read_json(resp)
        served = {v.get("version") for v in group.get("versions") or ()}
        for version in DRA_VERSIONS:
            cls = getattr(client, _SLICE_APIS[version], None)
            if version in served and cls is not None:
                return cls(api).list_resource_slice
        raise RuntimeError(
            f"resource.k8s.io serves {sorted(v for v in served if v)}; this exporter reads "
            f"{', '.join(DRA_VERSIONS)} (a kubernetes client too old for v1 needs upgrading)"
        )

    # -- pods --

    def _pod_info(self, obj: Mapping[str, Any]) -> PodInfo | None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        status = obj.get("status") or {}
        containers: dict[str, str] = {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or ():
                cid = (cs.get("containerID") or "").partition("://")[2]
                if cid and cs.get("name"):
                    containers[cid] = cs["name"]
        return PodInfo(
            uid=uid,
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            containers=MappingProxyType(containers),
            labels=self._labels(meta.get("labels") or {}),
        )

    def _labels(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        if self._allow is None or not labels:
            return _EMPTY
        out: dict[str, str] = {}
        for name in sorted(labels):  # on a name clash after sanitizing, the first name wins
            if self._allow.fullmatch(name):
                out.setdefault(sanitize_label_name(name), str(labels[name]))
        return MappingProxyType(out) if out else _EMPTY

    def _replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        by_name: dict[tuple[str, str], PodInfo] = {}
        for obj in items:
            if (p := self._pod_info(obj)) is not None:
                by_name[(p.namespace, p.name)] = p
        self._pods = (_uid_index(by_name.values(), items), by_name)

    def _pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        p = self._pod_info(obj)
        if p is None:
            return
        by_uid, by_name = dict(self._pods[0]), dict(self._pods[1])
        mirror = ((obj.get("metadata") or {}).get("annotations") or {}).get(_MIRROR)
        key = (p.namespace, p.name)
        if kind == "DELETED":
            by_uid.pop(p.uid, None)
            if mirror:
                by_uid.pop(mirror, None)
            if key in by_name and by_name[key].uid == p.uid:
                del by_name[key]
        else:
            old = by_name.get(key)
            if old is not None and old.uid != p.uid:
                by_uid.pop(old.uid, None)
            by_uid[p.uid] = p
            if mirror:
                by_uid[mirror] = p
            by_name[key] = p
        self._pods = (by_uid, by_name)

    # -- ResourceSlices --

    def _replace_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices = {(o.get("metadata") or {}).get("name", ""): _parse_slice(o) for o in items}
        self._devices = _device_index(self._slices.values())

    def _slice_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        slices = dict(self._slices)
        if kind == "DELETED":
            slices.pop(name, None)
        else:
            slices[name] = _parse_slice(obj)
        self._slices = slices
        self._devices = _device_index(slices.values())


class _Reflector:
    """List and watch one resource, forever, calling back with what changed."""

    def __init__(
        self,
        what: str,
        selector: str,
        resolve: Callable[[], Callable[..., Any]],
        on_list: Callable[[list[Mapping[str, Any]]], None],
        on_event: Callable[[str, Mapping[str, Any]], None],
        stop: threading.Event,
        timing: Timing,
    ) -> None:
        self.what, self.selector, self.timing = what, selector, timing
        self._resolve, self._on_list, self._on_event, self._stop = resolve, on_list, on_event, stop
        self._resp: Any = None
        self.rv: str | None = None  # where the next watch starts; None: list first
        self.synced = False
        self.status = f"{what}: waiting for the first list from the API server"

    def run(self) -> None:
        list_fn: Callable[..., Any] | None = None
        delay = self.timing.backoff_initial_s
        failing = ""
        after_gone = False
        while not self._stop.is_set():
            try:
                if self.rv is None or list_fn is None:
                    list_fn = self._resolve()
                    self.rv = self._list(list_fn, consistent=after_gone)
                    if failing:
                        log.info("%s: API server reachable again", self.what)
                    failing = ""
                quick = self._watch(list_fn, self.rv)
                if failing:
                    log.info("%s: watch resumed", self.what)
                failing, after_gone = "", False
                if not quick:
                    delay = self.timing.backoff_initial_s
                    continue
                # An empty stream that ended at once: do not spin on such a server.
                self._stop.wait(delay)
                delay = min(delay * 2, self.timing.backoff_max_s)
            except _Gone:
                self.rv = None
                if after_gone:  # 410 again right after a list: not worth a tight loop
                    self._stop.wait(delay)
                    delay = min(delay * 2, self.timing.backoff_max_s)
                after_gone = True
            except Exception as e:
                if self._stop.is_set():
                    break
                reason = _describe(e)
                if reason != failing:
                    log.warning("%s: %s", self.what, reason)
                    failing = reason
                connection = _is_connection_error(e)
                if not connection:
                    self.rv = None  # an answer we did not expect: start over, from discovery
                # Jitter spreads a fleet's retries after an API server restart.
                wait = delay * random.uniform(0.5, 1.0)
                retry = f"retrying in {wait:.2g} s"
                if connection:
                    self.status = f"{self.what}: API server unreachable ({retry}): {reason}"
                else:
                    self.status = f"{self.what}: {reason} ({retry})"
                self._stop.wait(wait)
                delay = min(delay * 2, self.timing.backoff_max_s)

    def abort(self) -> None:
        """Unblock a read in progress (from another thread)."""
        resp = self._resp
        if resp is None:
            return
        try:
            resp.shutdown()  # urllib3 >= 2.3
        except Exception:
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _list(self, list_fn: Callable[..., Any], consistent: bool) -> str:
        """Replace everything; the list's resourceVersion. Served from the API
        server's watch cache (resourceVersion=0): etcd has no index on spec.nodeName,
        so a quorum read per node scans every pod of the cluster. After a 410 the
        read is consistent instead, so the state cannot go back in time."""
        t = self.timing
        resp = list_fn(
            field_selector=self.selector,
            resource_version=None if consistent else "0",
            _preload_content=False,
            _request_timeout=(t.connect_timeout_s, t.list_timeout_s),
        )
        body = _read_json(resp)
        items = body.get("items") or []
        self._on_list(items)
        self.synced = True
        self.status = ""
        log.debug("%s: listed %d", self.what, len(items))
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, list_fn: Callable[..., Any], rv: str) -> bool:
        """Stream events into ``self.rv`` until the server ends the watch; True if it
        ended at once without events. Raises _Gone on 410, and what broke it."""
        from kubernetes.client.exceptions import ApiException

        t = self.timing
        timeout = int(t.watch_timeout_s * (1 + random.random() / 2))
        started = time.monotonic()
        try:
            resp = list_fn(
                field_selector=self.selector,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(t.connect_timeout_s, timeout + t.read_grace_s),
            )
        except ApiException as e:
            if e.status == 410:
                raise _Gone from e
            raise
        self._resp = resp
        if self._stop.is_set():  # stop() came before _resp was there to abort
            self.abort()
        self.status = ""
        events = 0
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise RuntimeError(
                        f"watch error {obj.get('code')} {obj.get('reason')}: {obj.get('message')}"
                    )
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj)
                    events += 1
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    self.rv = str(new_rv)
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return events == 0 and time.monotonic() - started < min(1.0, timeout / 2)


def _lines(resp: Any) -> Iterable[str]:
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")


def _read_json(resp: Any) -> dict[str, Any]:
    try:
        data = resp.data
    finally:
        resp.release_conn()
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _uid_index(pods: Iterable[PodInfo], items: Iterable[Mapping[str, Any]]) -> dict[str, PodInfo]:
    by_uid = {p.uid: p for p in pods}
    for obj in items:
        meta = obj.get("metadata") or {}
        mirror = (meta.get("annotations") or {}).get(_MIRROR)
        if mirror and meta.get("uid") in by_uid:
            by_uid[mirror] = by_uid[meta["uid"]]
    return by_uid


def _parse_slice(obj: Mapping[str, Any]) -> tuple[str, str, int, tuple[SliceDevice, ...]]:
    spec = obj.get("spec") or {}
    driver = spec.get("driver", "")
    pool = spec.get("pool") or {}
    pool_name = pool.get("name", "")
    devices = []
    for dev in spec.get("devices") or ():
        # v1beta1 nests attributes under "basic"; v1beta2 and v1 do not.
        attrs = dev.get("attributes") or (dev.get("basic") or {}).get("attributes") or {}
        a = {k.removeprefix(driver + "/"): _attr_value(v) for k, v in attrs.items()}
        devices.append(
            SliceDevice(
                driver=driver,
                pool=pool_name,
                name=dev.get("name", ""),
                type=a.get("type", ""),
                uuid=a.get("uuid", ""),
                parent_uuid=a.get("parentUUID", ""),
                profile=a.get("profile", ""),
            )
        )
    return driver, pool_name, int(pool.get("generation") or 0), tuple(devices)


def _attr_value(v: Any) -> str:
    if not isinstance(v, Mapping):
        return ""
    for key in ("string", "version", "int", "bool"):
        if key in v:
            x = v[key]
            return str(x).lower() if isinstance(x, bool) else str(x)
    return ""


def _device_index(
    slices: Iterable[tuple[str, str, int, tuple[SliceDevice, ...]]],
) -> dict[tuple[str, str, str], SliceDevice]:
    """Devices of each pool's newest generation: older slices linger while a
    driver republishes."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for driver, pool, gen, _ in slices:
        newest[(driver, pool)] = max(gen, newest.get((driver, pool), gen))
    return {
        (d.driver, d.pool, d.name): d
        for driver, pool, gen, devices in slices
        if gen == newest[(driver, pool)]
        for d in devices
    }


def _default_api_client() -> Any:
    try:
        from kubernetes import client, config
    except ImportError as e:
        raise RuntimeError(f"{e}: pod attribution needs it (pip install kubernetes)") from e

    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except config.ConfigException as in_cluster:
        try:
            # KUBECONFIG read now, not when kubernetes.config was imported; never write it back.
            path = os.environ.get("KUBECONFIG") or "~/.kube/config"
            return config.new_client_from_config(config_file=path, persist_config=False)
        except Exception as e:
            raise RuntimeError(
                f"no Kubernetes configuration: not in a cluster ({in_cluster}) and no usable "
                f"kubeconfig ({e})"
            ) from e


def _is_connection_error(e: BaseException) -> bool:
    import urllib3.exceptions as u

    return isinstance(e, u.HTTPError | OSError) and not isinstance(e, u.ResponseError)


def _describe(e: BaseException) -> str:
    """One short line for status and logs."""
    import urllib3.exceptions as u
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        msg = f"HTTP {e.status} {e.reason}"
        try:
            detail = json.loads(e.body or "{}").get("message")
        except (ValueError, AttributeError):
            detail = None
        if detail:
            msg += f": {detail}"
        if e.status in (401, 403):
            msg += " (needs get, list and watch on pods, and on resourceslices with DRA)"
        return msg[:300]
    if isinstance(e, u.MaxRetryError) and e.reason is not None:
        return _describe(e.reason)
    if isinstance(e, u.ReadTimeoutError):
        return "read timed out"
    text = re.sub(r"^<[^>]*>: ", "", str(e)) or type(e).__name__
    if isinstance(e, u.ProtocolError):
        text = f"connection broken: {text}"
    return text[:300]
