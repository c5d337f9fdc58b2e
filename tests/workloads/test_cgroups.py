"""Host PID -> pod and container, against the fixture /proc tree (tests/fixtures/proc)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.workloads.cgroups import ContainerRef, container_of, parse_cgroup

PROC = str(Path(__file__).parents[1] / "fixtures" / "proc")

TRAIN = "5c0ba7e2-3f1d-4c6a-9b8e-1a2b3c4d5e6f"
INFER = "9a7e3c21-0b4d-4f8e-a6c2-7d5e1f3b9c08"
NOTEBOOK = "3f2a1b0c-4d5e-4f70-8192-a3b4c5d6e7f8"
JOB = "7b1e4d2a-8c3f-4e5a-9d6b-0c1f2e3d4a5b"
WORKER = "2e4d6f80-1a3c-4b5d-8e7f-9a0b1c2d3e4f"
STATIC = "26c0c144d4d190f45239fd0d44a8720d"
C = {
    "trainer": "06ea17a8981d25b0315ff17bd1ebad3d95c15a3f8b764eaadb93612d9b61a54e",
    "sidecar": "6c8b4535ccc87f19061c4646189e33d78f01c8b63dc4e3cb2f630b1796ee93b6",
    "server": "b3eacd33433b31b5252351032c9b3e7a2e7aa7738d5decdf0dd6c62680853c06",
    "notebook": "b53bcf919f24746d72094b8b86c0325cf40723d3d63240705db51a27b261bc96",
    "pause": "1c27906f0888ad61ab5ede2e551ec1792427e4ee6ea4a452b561ed7f0221ae71",
    "probe": "2053dbbf6ec7135c4e994d3464c478db6f48d3ca21052c8f44915edc96e02c39",
    "job": "fbd537f80973c4d3a69422424b9a0122600946910557c835e36530d6e012c263",
    "worker": "18b831acbab5e234a2f35071ee9baae523ee9cb382eb63aae6c72313101fb53c",
}

# pid -> (what its cgroup file shows, expected result)
CASES = {
    1001: ("v2, systemd, containerd, Burstable", ContainerRef(TRAIN, C["trainer"])),
    1002: ("v2, cgroupfs, containerd, Burstable", ContainerRef(TRAIN, C["sidecar"])),
    1003: ("v1, systemd, CRI-O, Guaranteed; rdma and misc at /", ContainerRef(INFER, C["server"])),
    1004: ("v1, cgroupfs, docker, BestEffort", ContainerRef(NOTEBOOK, C["notebook"])),
    1005: ("v2, systemd, containerd, BestEffort", ContainerRef(JOB, C["job"])),
    1006: ("v2, cgroupfs, Guaranteed", ContainerRef(WORKER, C["worker"])),
    1007: ("v2, systemd, cri-dockerd (docker-<id>.scope)", ContainerRef(NOTEBOOK, C["notebook"])),
    1008: ("v2, seen from another cgroup namespace (/../..)", ContainerRef(TRAIN, C["trainer"])),
    1009: ("v2, a sub-cgroup the workload made", ContainerRef(TRAIN, C["trainer"])),
    1010: ("v2, kubelet nested under kubelet.slice (kind)", ContainerRef(JOB, C["job"])),
    1011: ("static pod: 32-hex UID", ContainerRef(STATIC, C["probe"])),
    1012: ("the pod's pause (sandbox) container", ContainerRef(TRAIN, C["pause"])),
    1013: ("CRI-O's conmon next to the container", None),
    1014: ("v1, in the pod's cgroup, no container", ContainerRef(NOTEBOOK, "")),
    1: ("host init", None),
    2: ("kernel thread (0::/)", None),
    1100: ("host service", None),
    1101: ("plain docker container, not Kubernetes", None),
    1102: ("user session", None),
    1200: ("unreadable: cgroup is a directory", None),
    1201: ("empty file", None),
    1202: ("binary garbage", None),
    99999: ("process gone", None),
}


@pytest.mark.parametrize("pid", list(CASES), ids=[f"{p}-{c[0]}" for p, c in CASES.items()])
def test_fixture_proc(pid):
    assert container_of(pid, PROC) == CASES[pid][1]


def test_every_fixture_pid_is_covered():
    assert {int(p) for p in os.listdir(PROC) if p.isdigit()} == set(CASES) - {99999}


def test_uid_is_canonical_with_dashes():
    ref = container_of(1001, PROC)
    assert ref is not None and "_" not in ref.pod_uid and ref.pod_uid.count("-") == 4


def test_proc_root_with_trailing_slash():
    assert container_of(1001, PROC + "/") == CASES[1001][1]


def test_missing_proc_root():
    assert container_of(1001, "/nonexistent/proc") is None


NOBODY = 65534  # the unprivileged user of Debian and most distributions


def _unprivileged(fn: Callable[[], object]) -> str:
    """repr of ``fn()`` run without privileges: as is for a normal user; for root (CI),
    in a forked child that drops to user and group nobody first (root reads any file,
    whatever its mode)."""
    if os.geteuid() != 0:
        return repr(fn())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run, report, leave without pytest's cleanup
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = repr(fn())
        except BaseException as e:  # reported to the parent, which fails on it
            out = f"raised {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    return got


def test_permission_denied():
    """A cgroup file the exporter may not read (mode 0, an unprivileged reader): no pod,
    no exception."""
    proc = Path(tempfile.mkdtemp(prefix="proc-"))  # not below pytest's root-only tmp folder
    try:
        proc.chmod(0o755)
        (proc / "7").mkdir(mode=0o755)
        f = proc / "7" / "cgroup"
        f.write_text((Path(PROC) / "1001" / "cgroup").read_text())
        assert container_of(7, str(proc)) is not None or os.geteuid() != 0  # readable as root
        f.chmod(0)

        def read() -> object:
            try:
                f.read_bytes()
            except PermissionError:
                return ("denied", container_of(7, str(proc)))
            return "readable"  # the check below fails: the test would prove nothing

        assert _unprivileged(read) == repr(("denied", None))
    finally:
        shutil.rmtree(proc)


def test_own_process_on_this_machine_does_not_raise():
    ref = container_of(os.getpid())
    assert ref is None or isinstance(ref, ContainerRef)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", None),
        ("garbage without colons\n", None),
        # v1 lists the pod once per controller; a line naming the container wins
        # over an earlier one that stops at the pod.
        (
            f"3:cpu:/kubepods/pod{WORKER}\n2:memory:/kubepods/pod{WORKER}/{C['worker']}\n",
            ContainerRef(WORKER, C["worker"]),
        ),
        (f"0::/kubepods/burstable/pod{TRAIN}/not-a-container\n", ContainerRef(TRAIN, "")),
        # A pod in a pod: the outermost is the one this node's API server knows.
        (
            f"0::/kubepods/pod{WORKER}/{C['worker']}/kubepods/pod{TRAIN}/{C['trainer']}\n",
            ContainerRef(WORKER, C["worker"]),
        ),
        ("0::/kubepods/burstable/podnot-a-uid/" + C["worker"] + "\n", None),
    ],
)
def test_parse_cgroup(text, expected):
    assert parse_cgroup(text) == expected
