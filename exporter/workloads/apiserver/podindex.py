"""The pod index: this node's pods by UID and by name, and which of their labels are copied.

Built from API-server pod objects (list, then watch events). Readers get
immutable snapshots (dicts swapped whole, never mutated), so lookups from other
threads take no lock. Everything kept is bounded (exporter/workloads/limits.py):
pods, containers per pod, copied labels per pod and their lengths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from exporter.workloads import limits
from exporter.workloads.limits import Drops

MIRROR = "kubernetes.io/config.mirror"  # a static pod's UID (as in its cgroup) on its mirror pod
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_EMPTY: Mapping[str, str] = MappingProxyType({})
_NO_TIMES: Mapping[str, tuple[float | None, float | None]] = MappingProxyType({})

RESERVED_LABELS = frozenset(
    {
        # the exporter's own labels on GPU and MIG series
        "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname",
        "GPU_I_PROFILE", "GPU_I_ID", "GPU_CI_ID", "DCGM_FI_DRIVER_VERSION",
        "DCGM_FI_SYSTEM_DRIVER_VERSION", "err_code", "err_msg",
        "peer_gpu", "link_status", "resource",
        # pod attribution
        "pod", "namespace", "container", "pod_uid", "dra_claim_name", "dra_claim_namespace",
        "dra_driver_name", "dra_pool_name", "dra_device_name", "dra_mig_profile",
        "dra_mig_device_uuid",
        # set by Prometheus on every target, or with a meaning of their own
        "job", "instance", "le", "quantile",
    }
)  # fmt: skip
"""Label names a copied pod label may never take (it is skipped and counted instead)."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod on this node. ``containers`` maps container ID (no ``containerd://``
    prefix) to container name for every container that has started, init and
    ephemeral ones included; ``labels`` holds the copied pod labels as
    (Prometheus label name, value) pairs, sanitized and bounded; ``times`` maps an app
    container's name to its (``startedAt``, ``finishedAt``), unix seconds, None where not
    given."""

    uid: str
    name: str
    namespace: str
    containers: Mapping[str, str]
    labels: Mapping[str, str]
    times: Mapping[str, tuple[float | None, float | None]] = field(
        default_factory=lambda: _NO_TIMES
    )
    # (container, resource name, resource ID) of each allocated resource KEP-4680's
    # allocatedResourcesStatus reports Unhealthy (DRA: claim:<claim>/<request>)
    unhealthy: tuple[tuple[str, str, str], ...] = ()


def sanitize_label_name(name: str) -> str:
    """Prometheus label name for a pod label, as kube-state-metrics names it:
    ``app.kubernetes.io/name`` -> ``label_app_kubernetes_io_name``."""
    return "label_" + _INVALID_LABEL_CHARS.sub("_", name)


def sanitize_dcgm_label_name(name: str) -> str:
    """Prometheus label name for a pod label as dcgm-exporter copies it (no prefix):
    ``app.kubernetes.io/name`` -> ``app_kubernetes_io_name``; a leading digit gets
    a ``_`` in front, since label names cannot start with one."""
    out = _INVALID_LABEL_CHARS.sub("_", name)
    return "_" + out if out[:1].isdigit() else out


class LabelPolicy:
    """Which pod labels are copied, under which names.

    ``prefixed``: regular expression a label's whole name must match to be copied
    as ``label_<name>`` (our ``--kubernetes-pod-labels``); None copies none this way.
    ``copy_all``: copy labels under their sanitized names (dcgm-exporter's
    ``--kubernetes-enable-pod-labels``), those matching any of ``allowlist``
    (searched anywhere in the name, as dcgm-exporter does; empty: all).
    Raises ValueError for an expression that does not compile.
    """

    def __init__(
        self, prefixed: str | None = None, copy_all: bool = False, allowlist: Iterable[str] = ()
    ) -> None:
        self.prefixed = _compile(prefixed, "pod label allow-list") if prefixed else None
        self.copy_all = copy_all
        self.allowlist = tuple(_compile(a, "pod label allowlist regex") for a in allowlist if a)

    @property
    def active(self) -> bool:
        """True when any label is copied."""
        return self.prefixed is not None or self.copy_all

    def select(self, labels: Mapping[str, Any], drops: Drops) -> Mapping[str, str]:
        """The copied labels of one pod, in name order; on a name clash after
        sanitizing the first name wins. Drops are counted in ``drops``."""
        if not self.active or not isinstance(labels, Mapping) or not labels:
            return _EMPTY
        out: dict[str, str] = {}
        for name in sorted(str(k) for k in labels):
            for target in self._targets(name):
                if not _fits(target, drops) or target in out:
                    continue
                if len(out) >= limits.MAX_POD_LABELS:
                    drops.add("pod_labels")
                    continue
                value = str(labels[name])
                if len(value) > limits.MAX_LABEL_VALUE_CHARS:
                    drops.add("pod_label_value")
                    value = value[: limits.MAX_LABEL_VALUE_CHARS]
                out[target] = value
        return MappingProxyType(out) if out else _EMPTY

    def _targets(self, name: str) -> list[str]:
        out = []
        if self.prefixed is not None and self.prefixed.fullmatch(name):
            out.append(sanitize_label_name(name))
        if self.copy_all and (not self.allowlist or any(a.search(name) for a in self.allowlist)):
            out.append(sanitize_dcgm_label_name(name))
        return out


def _fits(target: str, drops: Drops) -> bool:
    if len(target) > limits.MAX_LABEL_NAME_CHARS:
        drops.add("pod_label_name")
        return False
    if target in RESERVED_LABELS or target.startswith("__") or not target:
        drops.add("pod_label_reserved")
        return False
    return True


def _compile(expr: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(expr)
    except re.error as e:
        raise ValueError(f"{what} {expr!r} is not a regex: {e}") from e


def _name(value: Any) -> str | None:
    """A name field of an API object, or None when it is not a bounded string."""
    if isinstance(value, str) and len(value) <= limits.MAX_NAME_CHARS:
        return value
    return None


def _containers(status: Mapping[str, Any], drops: Drops) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        statuses = status.get(key) or ()
        if not isinstance(statuses, list):
            continue
        for cs in statuses:
            if not isinstance(cs, Mapping):
                continue
            cid = str(cs.get("containerID") or "").partition("://")[2]
            name = _name(cs.get("name"))
            if not cid or not name:
                continue
            if len(out) >= limits.MAX_CONTAINERS_PER_POD or len(cid) > limits.MAX_NAME_CHARS:
                drops.add("pod_containers")
                continue
            out[cid] = name
    return MappingProxyType(out)


def _stamp(value: Any) -> float | None:
    """Unix seconds of an RFC 3339 time of the API (``2026-05-01T10:01:00Z``); None when
    it is not one."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        got = datetime.fromisoformat(value)
    except ValueError:
        return None
    if got.tzinfo is None:
        got = got.replace(tzinfo=UTC)
    return got.timestamp()


def _times(status: Mapping[str, Any]) -> Mapping[str, tuple[float | None, float | None]]:
    """Each app container's (startedAt, finishedAt): of its running or terminated state."""
    statuses = status.get("containerStatuses")
    if not isinstance(statuses, list):
        return _NO_TIMES
    out: dict[str, tuple[float | None, float | None]] = {}
    for cs in statuses[: limits.MAX_CONTAINERS_PER_POD]:
        if not isinstance(cs, Mapping) or not (name := _name(cs.get("name"))):
            continue
        state = cs.get("state")
        state = state if isinstance(state, Mapping) else {}
        running, ended = state.get("running"), state.get("terminated")
        if isinstance(ended, Mapping):
            out[name] = (_stamp(ended.get("startedAt")), _stamp(ended.get("finishedAt")))
        elif isinstance(running, Mapping):
            out[name] = (_stamp(running.get("startedAt")), None)
    return MappingProxyType(out) if out else _NO_TIMES


class PodIndex:
    """This node's pods, indexed by UID (and mirror UID) and by (namespace, name)."""

    def __init__(self, policy: LabelPolicy, drops: Drops) -> None:
        self.policy = policy
        self.drops = drops
        self._pods: tuple[Mapping[str, PodInfo], Mapping[tuple[str, str], PodInfo]] = ({}, {})
        self._mirrors: dict[tuple[str, str], str] = {}  # written by the watch thread only

    def pod(self, uid: str) -> PodInfo | None:
        """The pod with this UID (or, for a static pod, its cgroup UID); None if unknown."""
        return self._pods[0].get(uid)

    def pod_by_name(self, namespace: str, name: str) -> PodInfo | None:
        """The pod with this namespace and name; None if unknown."""
        return self._pods[1].get((namespace, name))

    def pods(self) -> list[PodInfo]:
        """Every pod kept, as of the last event."""
        return list(self._pods[1].values())

    def __len__(self) -> int:
        return len(self._pods[1])

    def sizes(self) -> tuple[int, int]:
        """(entries by UID, mirror UIDs included; pods by name): what the index holds."""
        uids, names = self._pods
        return len(uids), len(names)

    def info(self, obj: Any) -> PodInfo | None:
        """The PodInfo of one API pod object; None when it has no usable identity."""
        if not isinstance(obj, Mapping):
            return None
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        uid, name, namespace = (_name(meta.get(k)) for k in ("uid", "name", "namespace"))
        if not uid or name is None or namespace is None:
            self.drops.add("pod_invalid")
            return None
        status = obj.get("status")
        status = status if isinstance(status, Mapping) else {}
        return PodInfo(
            uid=uid,
            name=name,
            namespace=namespace,
            containers=_containers(status, self.drops),
            labels=self.policy.select(meta.get("labels") or {}, self.drops),
            times=_times(status),
            unhealthy=_unhealthy(status),
        )

    def replace(self, items: Iterable[Any]) -> None:
        """Replace every pod with those of a list answer (at most ``MAX_PODS``)."""
        by_uid: dict[str, PodInfo] = {}
        by_name: dict[tuple[str, str], PodInfo] = {}
        self._mirrors = {}
        for obj in items:
            if len(by_name) >= limits.MAX_PODS:
                self.drops.add("pods")
                continue
            if (p := self.info(obj)) is None:
                continue
            by_name[(p.namespace, p.name)] = p
            by_uid[p.uid] = p
            if mirror := _mirror(obj):
                by_uid[mirror] = p
                self._mirrors[(p.namespace, p.name)] = mirror
        self._pods = (by_uid, by_name)

    def event(self, kind: str, obj: Any) -> None:
        """Apply one watch event (ADDED, MODIFIED or DELETED)."""
        p = self.info(obj)
        if p is None:
            return
        key = (p.namespace, p.name)
        if kind != "DELETED" and key not in self._pods[1] and len(self._pods[1]) >= limits.MAX_PODS:
            self.drops.add("pods")
            return
        by_uid, by_name = dict(self._pods[0]), dict(self._pods[1])
        old = by_name.pop(key, None)
        if old is not None and (kind != "DELETED" or old.uid == p.uid):
            # the old entries go, mirror UID included: churn in annotations must not pile up
            by_uid.pop(old.uid, None)
            by_uid.pop(self._mirrors.pop(key, ""), None)
        elif old is not None:
            by_name[key] = old  # a DELETED event of an older pod of that name
        if kind == "DELETED":
            by_uid.pop(p.uid, None)
        else:
            by_uid[p.uid] = p
            by_name[key] = p
            if mirror := _mirror(obj):
                by_uid[mirror] = p
                self._mirrors[key] = mirror
        self._pods = (by_uid, by_name)


MAX_UNHEALTHY = 64  # unhealthy resources kept per pod


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _unhealthy(status: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(container, resource name, resource ID) of each resource a container's
    allocatedResourcesStatus (KEP-4680) reports ``Unhealthy``, the first MAX_UNHEALTHY."""
    out: list[tuple[str, str, str]] = []
    for cs in _list(status.get("containerStatuses")) + _list(status.get("initContainerStatuses")):
        if not isinstance(cs, Mapping):
            continue
        for rs in _list(cs.get("allocatedResourcesStatus")):
            for r in _list(rs.get("resources")) if isinstance(rs, Mapping) else ():
                if isinstance(r, Mapping) and r.get("health") == "Unhealthy":
                    names = (
                        _name(cs.get("name")),
                        _name(rs.get("name")),
                        _name(r.get("resourceID")),
                    )
                    if None not in names and len(out) < MAX_UNHEALTHY:
                        out.append(names)  # type: ignore[arg-type]
    return tuple(out)


def _mirror(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    return _name(annotations.get(MIRROR)) or None
