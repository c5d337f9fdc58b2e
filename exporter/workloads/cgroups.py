"""Host PID -> (pod UID, container ID) from the process's cgroup path.

NVML reports host PIDs. The kubelet puts every container in a cgroup below the
pod's, and the runtime names the container's cgroup after its ID, so
``<proc_root>/<pid>/cgroup`` holds both. Shapes handled (any QoS class):

    cgroup v2, systemd driver, containerd:
      0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _>.slice/
         cri-containerd-<id>.scope
    cgroup v2, cgroupfs driver:
      0::/kubepods/burstable/pod<uid, ->/<id>
    cgroup v1 (one line per controller), systemd driver, CRI-O:
      4:memory:/kubepods.slice/.../kubepods-pod<uid>.slice/crio-<id>.scope
    docker / cri-dockerd: docker-<id>.scope (systemd) or <id> (cgroupfs)

The pod is the path component ``pod<uid>`` (``kubepods-<qos>-pod<uid>.slice``
under systemd, where the UID's dashes became underscores); the container is the
component right below it. Only components are matched, never the whole path, so
paths below a container (a workload's own sub-cgroups) and paths relative to
another cgroup namespace (``0::/../../kubepods-...``, what a containerised
reader of the host's /proc sees on cgroup v2) resolve the same way. Static pods
have 32-hex UIDs (the mirror pod carries it in ``kubernetes.io/config.mirror``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:[\w.-]*-)?pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?")
_CONTAINER = re.compile(r"(?:([a-z0-9][a-z0-9-]*)-)?([0-9a-f]{64})(?:\.scope)?")
# CRI-O's monitor process sits next to the container in crio-conmon-<id>.scope:
# it belongs to the pod but runs none of the container's code.
_NOT_A_CONTAINER = ("conmon",)
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """Where a process runs.

    ``container_id`` is the runtime's ID without its ``containerd://``-style
    prefix (64 hex digits for containerd, CRI-O and docker); it is "" for a
    process that sits in the pod's own cgroup rather than in a container's
    (possible on cgroup v1 only).
    """

    pod_uid: str
    container_id: str


def container_of(pid: int, proc_root: str = "/proc") -> ContainerRef | None:
    """Pod and container of a host PID from <proc_root>/<pid>/cgroup.

    None for non-pod processes (host services, kernel threads, CRI-O's conmon),
    for a process that is gone, and when the file cannot be read.
    """
    try:
        with open(os.path.join(proc_root, str(int(pid)), "cgroup"), "rb") as f:
            data = f.read(_MAX_BYTES)
    except (OSError, ValueError):
        return None
    return parse_cgroup(data.decode("utf-8", errors="replace"))


def parse_cgroup(text: str) -> ContainerRef | None:
    """The ContainerRef in the text of a /proc/<pid>/cgroup file, or None.

    Lines are ``hierarchy:controllers:path``; the first line whose path names a
    container wins, else the first that names only a pod (cgroup v1 lists the
    same place once per controller, some of them possibly at the root).
    """
    pod_only: ContainerRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = _parse_path(parts[2].strip())
        if ref is None:
            continue
        if ref.container_id:
            return ref
        if pod_only is None:
            pod_only = ref
    return pod_only


def _parse_path(path: str) -> ContainerRef | None:
    parts = [p for p in path.split("/") if p]
    # The outermost pod wins: a kubelet nested in a pod (kind) is not this node's.
    for i in range(len(parts)):
        m = _POD.fullmatch(parts[i])
        if m is None:
            continue
        uid = m.group(1).replace("_", "-")
        if i + 1 == len(parts):
            return ContainerRef(uid, "")
        c = _CONTAINER.fullmatch(parts[i + 1])
        if c is None:
            return ContainerRef(uid, "")
        prefix = c.group(1) or ""
        if any(word in prefix.split("-") for word in _NOT_A_CONTAINER):
            return None
        return ContainerRef(uid, c.group(2))
    return None
