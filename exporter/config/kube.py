"""Pod attribution's flags (-k and what goes with it) into one KubeConfig."""

from __future__ import annotations

import argparse

from exporter.config.dcgmflags import Resolver
from exporter.config.model import DEFAULT_SOCKET, ConfigError, KubeConfig, check_regex

MAX_ALLOWLIST = 100  # regexes in --kubernetes-pod-label-allowlist-regex


def add_flags(k: argparse._ArgumentGroup) -> None:
    """This exporter's own pod-attribution flags (dcgm-exporter's are in flags.py)."""
    k.add_argument(
        "--kubernetes-pod-labels",
        metavar="REGEX",
        help="copy pod labels whose names match REGEX, as label_<name> (needs the API server) "
        "(env GPU_EXPORTER_KUBERNETES_POD_LABELS)",
    )
    k.add_argument(
        "--kubernetes-dra",
        action="store_true",
        default=None,
        help="attribute DRA claims of gpu.nvidia.com through ResourceSlices (needs the API "
        "server) (env GPU_EXPORTER_KUBERNETES_DRA=true)",
    )
    k.add_argument(
        "--host-proc",
        metavar="PATH",
        help="the host's /proc, to map GPU processes to containers on shared GPUs "
        "(needs hostPID) (env GPU_EXPORTER_HOST_PROC; default /proc)",
    )


def _allowlist(r: Resolver) -> tuple[str, ...]:
    value, src = r.flag("kubernetes-pod-label-allowlist-regex")
    if value is None:
        return ()
    parts = [x.strip() for x in value.split(",") if x.strip()]
    if len(parts) > MAX_ALLOWLIST:
        raise ConfigError(f"{src}: {len(parts)} regexes; give at most {MAX_ALLOWLIST}")
    return tuple(check_regex(x, src) for x in parts)


def kube_config(r: Resolver, node: str) -> KubeConfig | None:
    """The pod-attribution settings with -k, else None; ConfigError on a bad value."""
    if not r.dcgm_boolean("kubernetes"):
        return None
    socket, _ = r.flag("pod-resources-kubelet-socket")
    names, _ = r.flag("nvidia-resource-names")
    # dcgm-exporter's flag, checked and accepted; every ID form is recognised either way
    id_type, src = r.flag("kubernetes-gpu-id-type")
    if id_type not in (None, "uid", "device-name"):
        raise ConfigError(f"{src}: {id_type!r} is not an ID type; use uid or device-name")
    labels, src = r.value(
        "kubernetes_pod_labels", "--kubernetes-pod-labels", "GPU_EXPORTER_KUBERNETES_POD_LABELS"
    )
    dra = r.boolean("kubernetes_dra", "GPU_EXPORTER_KUBERNETES_DRA")
    return KubeConfig(
        node_name=node,
        socket=socket or DEFAULT_SOCKET,
        resource_names=tuple(n.strip() for n in (names or "").split(",") if n.strip()),
        pod_uid=r.dcgm_boolean("kubernetes-enable-pod-uid"),
        pod_labels=check_regex(labels, src) if labels else None,
        dra=dra or r.dcgm_boolean("kubernetes-enable-dra"),
        host_proc=r.value("host_proc", "--host-proc", "GPU_EXPORTER_HOST_PROC")[0] or "/proc",
        dcgm_pod_labels=r.dcgm_boolean("kubernetes-enable-pod-labels"),
        pod_label_allowlist=_allowlist(r),
        virtual_gpus=r.dcgm_boolean("kubernetes-virtual-gpus"),
    )
