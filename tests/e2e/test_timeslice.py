"""A GPU time-sliced among three pods, and an MPS GPU, end to end through /metrics.

The exporter runs with -k against the fake kubelet, a fake API server (real wire
format) found through KUBECONFIG, and a fixture host /proc whose cgroup files
join NVML's host PIDs to the pods' containers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.sim import load_fleet
from exporter.sim.fleet import DEFAULT_FLEET
from tests.procs import Exporter, wait_until
from tests.support.exposition import find, without_holders
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FIX = Path(__file__).parents[1] / "fixtures" / "timeslice"
FB = "gpu_exporter_container_fb_used_bytes"
SM = "gpu_exporter_container_sm_util_ratio"
MIB = 2**20  # the fleet gives process memory in MiB; the families are in bytes


@pytest.fixture
def node(tmp_path):
    kubelet = FakeKubelet(tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None)))
    kubelet.start()
    api = FakeAPIServer(pods=list(yaml_docs(FIX / "pods.yaml"))).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "exporter", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "exporter"}}],
                "current-context": "fake",
            }
        )
    )
    exp = Exporter(
        "-c",
        "300",
        "-k",
        "--pod-resources-kubelet-socket",
        str(kubelet.socket_path),
        "--host-proc",
        str(FIX / "proc"),
        env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
    )
    try:
        exp.wait_ready()
        yield exp, kubelet, api
    finally:
        exp.stop()
        api.stop()
        kubelet.close()


def yaml_docs(path: Path):
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def per_container(text: str, name: str, gpu: str) -> dict[tuple[str, str, str], float]:
    return {
        (
            s.labels.get("namespace", ""),
            s.labels.get("pod", ""),
            s.labels.get("container", ""),
        ): s.value
        for s in find(text, name, gpu=gpu)
    }


def test_three_pods_on_one_time_sliced_gpu(node):
    exp, _, _ = node
    text = exp.wait_metrics(
        lambda t: find(t, FB, pod="batch-a"), 15, "per-container series joined to pods"
    )
    fb = per_container(text, FB, "1")
    assert set(fb) == {
        ("batch", "batch-a", "worker"),
        ("batch", "batch-b", "worker"),
        ("batch", "batch-c", "worker"),
    }
    fleet = load_fleet(DEFAULT_FLEET)
    procs = {p.pid: p.used_memory_mib * MIB for p in fleet.gpus[1].processes}
    assert fb[("batch", "batch-a", "worker")] == procs[41101]
    assert fb[("batch", "batch-b", "worker")] == procs[41102]
    assert fb[("batch", "batch-c", "worker")] == procs[41103]
    assert sum(fb.values()) == sum(procs.values())
    sm = per_container(text, SM, "1")
    assert set(sm) == set(fb) and all(0 <= v <= 1 for v in sm.values())  # a ratio
    # device series of the shared GPU carry no pod labels
    assert all(not s.labels.get("pod") for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="1"))
    assert all(not s.labels.get("pod") for s in find(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1"))


def test_mps_gpu_idle_container_and_unattributed_process(node):
    exp, _, _ = node
    text = exp.wait_metrics(lambda t: find(t, FB, pod="mps-a"), 15, "MPS series")
    fb = per_container(text, FB, "5")
    fleet = load_fleet(DEFAULT_FLEET)
    compute = {
        p.pid: p.used_memory_mib * MIB for p in fleet.gpus[5].processes if p.type == "compute"
    }
    assert fb[("serving", "mps-a", "client")] == compute[41501]
    assert fb[("serving", "mps-b", "client")] == 0  # holds a share, runs nothing
    assert sum(fb.values()) == sum(compute.values())


def test_pod_deleted_drops_its_series(node):
    exp, kubelet, _ = node
    exp.wait_metrics(lambda t: find(t, FB, pod="batch-b"), 15, "per-container series")
    names = [p.name for p in kubelet.pods.pod_resources]
    del kubelet.pods.pod_resources[names.index("batch-b")]
    text = exp.wait_metrics(lambda t: 'pod="batch-b"' not in without_holders(t), 3, "batch-b gone")
    # batch-b's process is still on the GPU (the simulation keeps it): now unattributed
    fb = per_container(text, FB, "1")
    assert ("", "", "") in fb and ("batch", "batch-a", "worker") in fb


def test_api_server_down_keeps_exporting(node, tmp_path):
    exp, _, api = node
    exp.wait_metrics(lambda t: find(t, FB, pod="batch-a"), 15, "joined series")
    api.stop()
    wait_until(
        lambda: b"API server" in exp.get("/ready")[2] or b"pods:" in exp.get("/ready")[2],
        15,
        "/ready to mention the API server",
    )
    status, _, _ = exp.get("/ready")
    assert status == 200
    assert 'pod="batch-a"' in exp.metrics()  # the last known pods stay in use
