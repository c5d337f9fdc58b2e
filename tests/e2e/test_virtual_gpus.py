"""--kubernetes-virtual-gpus end to end: series by pod on time-sliced and MPS GPUs.

Same node as test_timeslice.py (fake kubelet, fake API server, fixture host
/proc): GPU 1 is time-sliced among batch-a, batch-b and batch-c; GPU 5 is an
MPS GPU. Queries are the ones a dcgm-exporter user writes, by ``pod``.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from exporter.sim import load_fleet
from exporter.sim.fleet import DEFAULT_FLEET
from tests.e2e.test_exposition import ALLOWED_LINT
from tests.e2e.test_timeslice import yaml_docs
from tests.procs import Exporter, require
from tests.support.exposition import find, samples
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FIX = Path(__file__).parents[1] / "fixtures" / "timeslice"
BATCH = {"batch-a", "batch-b", "batch-c"}
SM = "gpu_exporter_container_sm_util_ratio"
PER_PROCESS = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}


def start(tmp_path: Path, *flags: str):
    kubelet = FakeKubelet(tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None)))
    kubelet.start()
    pods = list(yaml_docs(FIX / "pods.yaml"))
    api = FakeAPIServer(pods=pods).start()
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
        *("-c", "300", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path)),
        *("--host-proc", str(FIX / "proc"), *flags),
        env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
    )

    def stop():
        exp.stop()
        api.stop()
        kubelet.close()

    try:
        exp.wait_ready()
    except BaseException:
        stop()
        raise
    return exp, pods, stop


@pytest.fixture(scope="module")
def virtual(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("virtual")
    exp, pods, stop = start(tmp_path, "--kubernetes-virtual-gpus", "--kubernetes-enable-pod-uid")
    try:
        text = exp.wait_metrics(
            lambda t: find(t, "DCGM_FI_DEV_FB_USED", gpu="1", pod="batch-a") != [],
            20,
            "per-pod memory of the time-sliced GPU (processes joined to pods)",
        )
        yield text, pods
    finally:
        stop()


def test_every_series_of_a_shared_gpu_is_repeated_per_pod(virtual):
    text, _ = virtual
    per_family: dict[str, list] = {}
    for s in samples(text):
        if s.labels.get("gpu") == "1" and s.name.startswith("DCGM_"):
            per_family.setdefault(s.name, []).append(s)
    assert "DCGM_FI_DEV_POWER_USAGE" in per_family and "DCGM_FI_DEV_GPU_TEMP" in per_family
    for name, got in per_family.items():
        if name in PER_PROCESS:
            continue
        assert all(s.labels.get("namespace") == "batch" for s in got), name
        by_pod = Counter(s.labels["pod"] for s in got)
        assert set(by_pod) == BATCH, name
        assert len(set(by_pod.values())) == 1, name  # the same series set in every copy
    # a device value is repeated in each pod's copy, as dcgm-exporter does
    power = {s.labels["pod"]: s.value for s in per_family["DCGM_FI_DEV_POWER_USAGE"]}
    assert len(set(power.values())) == 1


def test_utilization_and_memory_by_pod_come_from_the_pods_processes(virtual):
    text, _ = virtual
    fleet = load_fleet(DEFAULT_FLEET)
    mem = {p.pid: p.used_memory_mib for p in fleet.gpus[1].processes}
    fb = find(text, "DCGM_FI_DEV_FB_USED", gpu="1")
    device = [s for s in fb if not s.labels.get("pod")]  # pod="" under -k
    assert len(device) == 1  # the GPU's own value stays, without pod labels
    by_pod = {s.labels["pod"]: s.value for s in fb if s.labels.get("pod")}
    assert by_pod == {"batch-a": mem[41101], "batch-b": mem[41102], "batch-c": mem[41103]}
    util = find(text, "DCGM_FI_DEV_GPU_UTIL", gpu="1")
    assert sum(not s.labels.get("pod") for s in util) == 1
    util_by_pod = {s.labels["pod"]: s.value for s in util if s.labels.get("pod")}
    # the DCGM copy keeps dcgm-exporter's unit (percent); ours is a ratio
    sm = {s.labels["pod"]: s.value * 100 for s in find(text, SM, gpu="1")}
    assert util_by_pod == pytest.approx(sm) and set(sm) == BATCH


def test_mps_holder_running_nothing_reads_zero(virtual):
    text, _ = virtual
    fleet = load_fleet(DEFAULT_FLEET)
    compute = {p.pid: p.used_memory_mib for p in fleet.gpus[5].processes if p.type == "compute"}
    fb = {
        s.labels["pod"]: s.value
        for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="5")
        if s.labels.get("pod")
    }
    assert fb["mps-a"] == compute[41501]
    assert fb["mps-b"] == 0
    temp = {s.labels["pod"] for s in find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="5")}
    assert {"mps-a", "mps-b"} <= temp


def test_copies_carry_pod_uid_vgpu_and_series_stay_unique(virtual):
    text, pods = virtual
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    power = find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="1")
    for s in power:
        assert s.labels["pod_uid"] == uids[s.labels["pod"]]
    # the replica IDs each pod holds (GPU-...::N); batch-c holds two, in one copy
    assert {s.labels["pod"]: s.labels["vgpu"] for s in power} == {
        "batch-a": "0",
        "batch-b": "1",
        "batch-c": "2,3",
    }
    keys = Counter((s.name, tuple(sorted(s.labels.items()))) for s in samples(text))
    assert [k for k, n in keys.items() if n > 1] == []


def test_unshared_gpus_are_unchanged(virtual):
    text, _ = virtual
    whole = find(text, "DCGM_FI_DEV_GPU_UTIL", gpu="0")
    assert [(s.labels["pod"], s.labels["container"]) for s in whole] == [("train-0", "trainer")]
    assert "vgpu" not in whole[0].labels


def test_off_by_default_shared_gpu_has_no_pod_series(tmp_path):
    exp, _, stop = start(tmp_path)
    try:
        text = exp.wait_metrics(lambda t: SM in t and 'pod="batch-a"' in t, 20, "shares")
        assert find(text, "DCGM_FI_DEV_GPU_UTIL", pod="batch-a") == []
        assert find(text, "DCGM_FI_DEV_POWER_USAGE", pod="batch-a") == []
        assert len(find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="1")) == 1
    finally:
        stop()


def test_promtool_accepts_the_copies(virtual):
    text, _ = virtual
    promtool = require("promtool", "prometheus")
    p = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    problems = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert [line for line in problems if not any(a in line for a in ALLOWED_LINT)] == []
