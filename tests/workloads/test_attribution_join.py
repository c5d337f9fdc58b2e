"""workloads/attribution.py with the API server: host PIDs joined to pods (a host /proc's
cgroup files, the API server's pods), and what the pods' records put on a GPU (UID,
labels). A real gRPC kubelet on a unix socket (the fake kubelet, the default node's pods)
and a real HTTP API server (the fake one, found through KUBECONFIG)."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from exporter.config.model import KubeConfig
from exporter.frame import Owner
from exporter.nvml.processes import ProcUse
from exporter.snapshot import Snapshot
from exporter.workloads.attribution import Attribution
from exporter.workloads.sharing import UNATTRIBUTED
from exporter.workloads.usage import HELD_PER_CYCLE
from tests.support.dranode import kubeconfig
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakeapi import load as load_api

FIXTURES = Path(__file__).parents[1] / "fixtures"
NODE = "sim-node"
MIB = 1 << 20
BATCH_A = Owner("batch", "batch-a", "worker")
BATCH_B = Owner("batch", "batch-b", "worker")
BATCH_C = Owner("batch", "batch-c", "worker")
TRAINER = Owner("ml", "train-0", "trainer")


def _pods() -> list[dict]:
    """The API server's pods on the node: the time-sliced GPU 1's and MPS GPU 5's
    (tests/fixtures/timeslice), and train-0 (GPU 0's holder) moved to this node."""
    with open(FIXTURES / "timeslice" / "pods.yaml") as f:
        pods = [d for d in yaml.safe_load_all(f) if d]
    train = copy.deepcopy(
        next(p for p in load_api("pods.yaml") if p["metadata"]["name"] == "train-0")
    )
    train["spec"]["nodeName"] = NODE
    return [*pods, train]


PODS = {p["metadata"]["name"]: p for p in _pods()}


def uid(pod: str) -> str:
    return PODS[pod]["metadata"]["uid"]


def container_id(pod: str, container: str) -> str:
    statuses = PODS[pod]["status"]["containerStatuses"]
    cid = next(s["containerID"] for s in statuses if s["name"] == container)
    return cid.split("://", 1)[1]


def cgroup(pod_uid: str, cid: str) -> str:
    """A cgroup v2 file as the systemd driver and containerd write it."""
    slice_ = f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
    return f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"


DELETED_UID = "0d5e1e7e-dead-4a11-8e00-000000000001"  # a pod the API server no longer knows
UNLISTED_CID = "f" * 64  # a container its pod's status does not list yet


class HostProc:
    """A host /proc of cgroup files, one per PID, rewritten as a test needs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, pid: int, text: str) -> None:
        (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "cgroup").write_text(text)

    def pod(self, pid: int, pod: str, container: str) -> None:
        self.put(pid, cgroup(uid(pod), container_id(pod, container)))


@pytest.fixture
def api(tmp_path, monkeypatch):
    server = FakeAPIServer(_pods()).start()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", server.url)))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    yield server
    server.stop()


@pytest.fixture
def proc(tmp_path) -> HostProc:
    host = HostProc(tmp_path / "proc")
    host.pod(41101, "batch-a", "worker")
    host.pod(41102, "batch-b", "worker")
    host.pod(41103, "batch-c", "worker")
    host.pod(45001, "train-0", "trainer")
    host.put(41900, "0::/system.slice/display-manager.service\n")  # outside Kubernetes
    host.put(41901, cgroup(DELETED_UID, "e" * 64))  # a deleted pod's leftover
    host.put(41902, cgroup(uid("batch-a"), UNLISTED_CID))  # a container not yet listed
    return host


def snapshot(inventory, processes: dict[int, tuple[tuple[int, float, float], ...]]) -> Snapshot:
    """The default node's devices, with (pid, MiB, SM %) processes on GPUs by index."""
    gpus, migs = inventory
    return Snapshot(
        1.8e9,
        0.0,
        gpus=tuple(gpus.values()),
        entities=(*gpus.values(), *migs.values()),
        processes=MappingProxyType(
            {gpus[i].key: tuple(ProcUse(*p) for p in ps) for i, ps in processes.items()}
        ),
    )


async def joined(attr: Attribution, snap: Snapshot) -> Attribution:
    """``attr`` once its watch has listed the API server's pods (cycles until then)."""
    for _ in range(200):
        await attr.refresh(snap)
        if attr.joinable:
            await attr.refresh(snap)  # a cycle with the pods known
            return attr
        await asyncio.sleep(0.05)
    raise AssertionError(f"the API server's pods never listed: {attr.details()}")


@pytest.fixture
async def attribution(kubelet, api, proc):
    attr = Attribution(
        KubeConfig(NODE, str(kubelet.socket_path), timeout_s=2, host_proc=str(proc.root))
    )
    yield attr
    await attr.close()


GPU1 = (
    (41101, 100.0, 10.0),  # batch-a
    (41102, 200.0, 20.0),  # batch-b
    (41103, 300.0, 30.0),  # batch-c
    (41900, 1000.0, 1.0),  # a host service
    (41901, 2000.0, 2.0),  # a deleted pod's
    (41902, 4000.0, 4.0),  # batch-a's, in a container the API server has not listed yet
    (43000, 8000.0, 8.0),  # no /proc entry to see
)


def split_of(attr: Attribution, snap: Snapshot, index: int, inventory) -> tuple[dict, dict]:
    gpus, _ = inventory
    (split,) = [s for s in attr.splits(snap) if s.device.key == gpus[index].key]
    return split.fb, split.sm


async def test_a_shared_gpus_processes_are_split_by_the_pod_they_run_in(attribution, inventory):
    """GPU 1 (time-sliced, three pods): each pod's container gets its own processes'
    memory and SM; a host service's, a deleted pod's, a not yet listed container's and an
    unseen PID's go to the unattributed part, so the parts add up to the device's."""
    snap = snapshot(inventory, {1: GPU1})
    await joined(attribution, snap)
    fb, sm = split_of(attribution, snap, 1, inventory)
    assert fb == {BATCH_A: 100.0, BATCH_B: 200.0, BATCH_C: 300.0, UNATTRIBUTED: 15000.0}
    assert sm == {BATCH_A: 10.0, BATCH_B: 20.0, BATCH_C: 30.0, UNATTRIBUTED: 15.0}
    assert attribution.status().api_up is True  # served as gpu_exporter_kube_api_up 1


async def test_a_lone_holders_strays_are_the_processes_known_to_run_elsewhere(
    attribution, inventory, proc
):
    """GPU 0 (train-0's alone): its trainer's process is its own; a host service's, a
    deleted pod's and another pod's are unaccounted; one that cannot be seen, or runs in
    a container its pod has not listed yet, is not known to be a stray."""
    rows = (
        (45001, 100.0, 50.0),  # train-0's trainer
        (41900, 1000.0, 1.0),  # a host service
        (41901, 2000.0, 2.0),  # a deleted pod's
        (41102, 16000.0, 3.0),  # batch-b's (it holds GPU 1)
        (41902, 4000.0, 4.0),  # a container not yet listed
        (43000, 8000.0, 8.0),  # not visible
    )
    gpus, _ = inventory
    snap = snapshot(inventory, {0: rows})
    await joined(attribution, snap)
    use = attribution.usage(snap)[gpus[0].key]
    assert [(c.pod, c.container, c.running) for c in use.claims] == [("train-0", "trainer", True)]
    assert (use.unaccounted_processes, use.unaccounted_bytes) == (3, 19000 * MIB)
    # only strays: the trainer is known to run nothing there
    snap = snapshot(inventory, {0: rows[1:4]})
    use = attribution.usage(snap)[gpus[0].key]
    assert [c.running for c in use.claims] == [False]


async def test_a_reused_pid_is_joined_again_and_a_live_one_is_read_once(
    attribution, inventory, proc
):
    """A PID's container is read from /proc once while the PID is on a GPU; once it has
    left every GPU, the same PID (reused by another pod's process) is joined anew."""
    snap = snapshot(inventory, {1: GPU1[:3]})
    await joined(attribution, snap)
    assert split_of(attribution, snap, 1, inventory)[0][BATCH_A] == 100.0
    proc.pod(41101, "batch-b", "worker")  # what /proc would say of a new process 41101
    assert split_of(attribution, snap, 1, inventory)[0][BATCH_A] == 100.0  # still the same one
    gone = snapshot(inventory, {1: GPU1[1:3]})
    assert split_of(attribution, gone, 1, inventory)[0][BATCH_A] == 0.0
    fb = split_of(attribution, snap, 1, inventory)[0]
    assert (fb[BATCH_A], fb[BATCH_B]) == (0.0, 300.0)  # 41101 now batch-b's


async def test_a_gpu_carries_its_pods_uid_and_labels_from_the_api_server(
    kubelet, api, proc, inventory
):
    """--kubernetes-pod-uid and --kubernetes-pod-labels: GPU 0's holder carries train-0's
    UID and its copied labels; a lone holder has no virtual-GPU index, the sharers of
    GPU 1 their replicas'. Without --kubernetes-pod-uid, no UID."""
    gpus, _ = inventory
    snap = snapshot(inventory, {})
    cfg = KubeConfig(
        NODE, str(kubelet.socket_path), timeout_s=2, host_proc=str(proc.root),
        pod_uid=True, pod_labels="team", virtual_gpus=True,
    )  # fmt: skip
    attr = await joined(Attribution(cfg), snap)
    try:
        held = attr.holders()[gpus[0].key]
        assert (held.owner, held.pod_uid, held.labels, held.vgpu) == (
            TRAINER,
            uid("train-0"),
            (("label_team", "ml"),),
            "",
        )
        sharers = {h.owner: (h.pod_uid, h.vgpu) for h in attr.sharers()[gpus[1].key]}
        assert sharers == {
            BATCH_A: (uid("batch-a"), "0"),
            BATCH_B: (uid("batch-b"), "1"),
            BATCH_C: (uid("batch-c"), "2,3"),
        }
    finally:
        await attr.close()
    cfg = KubeConfig(NODE, str(kubelet.socket_path), timeout_s=2, pod_labels="team")
    attr = await joined(Attribution(cfg), snap)
    try:
        assert attr.holders()[gpus[0].key].pod_uid == ""
    finally:
        await attr.close()


async def test_pod_labels_changed_in_the_api_server_follow_without_a_new_kubelet_answer(
    kubelet, api, proc, inventory
):
    """The kubelet's answer stays the same; train-0's labels change in the API server:
    GPU 0's labels follow (the holders are built again every cycle while watched)."""
    gpus, _ = inventory
    snap = snapshot(inventory, {})
    attr = await joined(
        Attribution(KubeConfig(NODE, str(kubelet.socket_path), pod_labels="team")), snap
    )
    try:
        assert attr.holders()[gpus[0].key].labels == (("label_team", "ml"),)
        pod = copy.deepcopy(PODS["train-0"])
        pod["metadata"]["labels"]["team"] = "infra"
        api.modify(pod)
        for _ in range(200):
            await attr.refresh(snap)
            if attr.holders()[gpus[0].key].labels != (("label_team", "ml"),):
                break
            await asyncio.sleep(0.05)
        assert attr.holders()[gpus[0].key].labels == (("label_team", "infra"),)
    finally:
        await attr.close()


async def test_what_the_watch_drops_is_counted_with_the_kubelets(attribution, api, inventory):
    """A pod without a UID is dropped by the watch: counted in the self-metrics' dropped
    inputs beside the kubelet's."""
    snap = snapshot(inventory, {})
    api.add({"kind": "Pod", "metadata": {"name": "nameless", "namespace": "x"},
             "spec": {"nodeName": NODE}})  # fmt: skip
    await joined(attribution, snap)
    assert ("pod_invalid", 1) in attribution.status().dropped


async def test_with_the_join_every_gpu_one_pod_holds_is_read_in_turn(attribution, inventory):
    """The default node's eight devices that one container holds, read HELD_PER_CYCLE a
    cycle: over two cycles each is read once; the shared ones every cycle."""
    gpus, _ = inventory
    snap = snapshot(inventory, {})
    await joined(attribution, snap)
    sole = sorted(k for k, o in attribution.mapper.map.owners.items() if len(o) == 1)
    assert len(sole) == 2 * HELD_PER_CYCLE
    lots = []
    for _ in range(2):
        wanted = attribution.wants_processes()
        lots.append([k for k in sole if wanted(k, {})])
        assert wanted(gpus[1].key, {}) and wanted(gpus[5].key, {})
    assert [len(lot) for lot in lots] == [HELD_PER_CYCLE, HELD_PER_CYCLE]
    assert sorted(lots[0] + lots[1]) == sole


async def test_a_holders_window_takes_its_containers_times_from_the_api_server(
    kubelet, api, proc, inventory
):
    """train-0 appears in the kubelet's second answer and leaves in its third: its hold
    starts at its container's startedAt and ends at its finishedAt (the API server's),
    not midway between the kubelet's answers."""
    gpus, _ = inventory
    snap = snapshot(inventory, {})
    full = kubelet.pods
    without = type(full)()
    without.pod_resources.extend(p for p in full.pod_resources if p.name != "train-0")
    kubelet.pods = without
    attr = await joined(Attribution(KubeConfig(NODE, str(kubelet.socket_path))), snap)
    try:
        attr.windows()
        kubelet.pods = full
        await attr.sight(1.8e9 + 5.0)
        key = (gpus[0].key, "ml", "train-0", "trainer")
        started = datetime(2026, 5, 1, 10, 1, tzinfo=UTC).timestamp()  # its startedAt
        assert attr.windows()[key].start == started
        pod = copy.deepcopy(PODS["train-0"])
        ended = {"startedAt": "2026-05-01T10:01:00Z", "finishedAt": "2026-05-01T12:00:00Z"}
        pod["status"]["containerStatuses"][0]["state"] = {"terminated": ended}
        api.modify(pod)
        for _ in range(200):  # until the watch has it
            info = attr.watcher.pod_by_name("ml", "train-0")
            if info is not None and info.times["trainer"][1] is not None:
                break
            await asyncio.sleep(0.05)
        kubelet.pods = without
        await attr.sight(1.8e9 + 10.0)
        window = attr.windows()[key]
        assert (window.start, window.end) == (None, started + 7140.0)
    finally:
        await attr.close()
