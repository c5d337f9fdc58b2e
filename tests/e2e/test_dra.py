"""DRA claims for a whole GPU and a MIG device, end to end through /metrics.

The fake kubelet reports dynamic_resources (driver, pool, device name); the exporter
resolves them to UUIDs through the pool's ResourceSlices, served by the fake API server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from exporter.sim.resourceslices import resource_claim
from tests.procs import Exporter
from tests.support.dranode import dra_node
from tests.support.exposition import find, samples
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids
from tests.support.fakekubelet import load_pods as load_kubelet

FIX = Path(__file__).parents[1] / "fixtures" / "dra"


def slices(ids: dict[str, str]) -> list[dict]:
    text = re.sub(
        r"\{([a-z]+:[0-9:]+)\}",
        lambda m: ids[m.group(1)],
        (FIX / "resourceslices.yaml").read_text(),
    )
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture
def node(tmp_path):
    ids = fleet_ids(None)
    kubelet = FakeKubelet(tmp_path / "k.sock", load_kubelet(FIX / "kubelet.yaml", ids)).start()
    api = FakeAPIServer(slices=slices(ids), slice_versions=("v1", "v1beta1")).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "f", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "f", "context": {"cluster": "f", "user": "u"}}],
                "current-context": "f",
            }
        )
    )
    exp = Exporter(
        "-c",
        "300",
        "-k",
        "--kubernetes-dra",
        "--pod-resources-kubelet-socket",
        str(kubelet.socket_path),
        env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
    )
    try:
        exp.wait_ready()
        yield exp
    finally:
        exp.stop()
        api.stop()
        kubelet.close()


def test_dra_claims_label_whole_gpu_and_mig_device(node):
    ids = fleet_ids(None)
    text = node.wait_metrics(lambda t: 'dra_claim_name="small-mig"' in t, 15, "DRA labels")
    whole = find(text, "DCGM_FI_DEV_FB_USED", gpu="3")
    assert [(s.labels["pod"], s.labels["namespace"], s.labels["container"]) for s in whole] == [
        ("dra-whole", "ml", "trainer")
    ]
    # dcgm-exporter's DRA labels (transformation/kubernetes.go): no MIG ones on a whole GPU
    assert {k: v for k, v in whole[0].labels.items() if k.startswith("dra_")} == {
        "dra_claim_name": "whole-gpu",
        "dra_claim_namespace": "ml",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "sim-node",
        "dra_device_name": "gpu-3",
    }
    assert "claim_name" not in whole[0].labels
    temp = find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    assert temp[0].labels["pod"] == "dra-whole"  # device-level series of a whole GPU too
    mig = [s for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7") if s.labels.get("GPU_I_ID") == "7"]
    assert [(s.labels["pod"], s.labels["dra_claim_name"]) for s in mig] == [
        ("dra-mig", "small-mig")
    ]
    assert (mig[0].labels["dra_mig_profile"], mig[0].labels["dra_mig_device_uuid"]) == (
        "1g.10gb",
        ids["mig:7:7"],
    )
    # dynamic MIG: the slice names the parent GPU and profile (3g.40gb is GI 2 on GPU 7)
    dyn = [s for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7") if s.labels.get("GPU_I_ID") == "2"]
    assert [(s.labels["pod"], s.labels["dra_claim_name"]) for s in dyn] == [
        ("dra-dynamic", "dynamic-mig")
    ]
    # the slice has no UUID yet: the live instance's, from NVML
    assert dyn[0].labels["dra_mig_device_uuid"] == ids["mig:7:2"]
    # the other MIG instances of GPU 7, and GPU 7's device series, stay unlabelled
    others = [
        s
        for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7")
        if s.labels.get("GPU_I_ID") not in ("7", "2")
    ]
    assert others and all(not s.labels.get("pod") for s in others)  # -k: pod=""
    assert "fpga" not in text  # other drivers' claims are not ours


SIM_FLEET = """
hostname: sim-node
gpus:
  - model: NVIDIA H100 80GB HBM3
  - model: NVIDIA H100 80GB HBM3
    mig: [{profile: 1g.10gb, gi: 9}, {profile: 1g.10gb, gi: 7}, {profile: 1g.10gb, gi: 13}]
pods:
  - {name: whole, namespace: ml, container: c, devices: ["gpu:0"], claim: whole-gpu}
  - {name: a, namespace: ml, container: c, devices: ["mig:1:7"], claim: mig-a}
  - {name: b, namespace: ml, container: c, devices: ["mig:1:9"], claim: mig-b}
  - {name: c, namespace: lab, container: c, devices: ["mig:1:13"], claim: mig-c}
"""


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_the_simulators_kubelet_serves_dra_claims(tmp_path, version):
    """``--simulate -k`` with a fleet whose pods hold their devices through claims: the
    simulator's pod-resources server names them as NVIDIA's DRA driver does, and its
    ResourceSlice (served by the fake API server) publishes the three same-profile MIG
    instances without UUIDs (dynamic MIG); each instance goes to its own claim."""
    with dra_node(tmp_path, SIM_FLEET, version) as (exp, doc, gpus):
        text = exp.wait_metrics(lambda t: 'dra_claim_name="mig-c"' in t, 15, "DRA labels")
    assert all("uuid" not in json.dumps(d) for d in doc["spec"]["devices"][1:])
    truth = {m.spec.gi: (m.uuid, m.spec.start) for m in gpus[1].migs}
    (whole,) = find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert (whole.labels["pod"], whole.labels["dra_device_name"]) == ("whole", "gpu-0")
    got = {
        s.labels["GPU_I_ID"]: (
            s.labels["pod"],
            s.labels["namespace"],
            s.labels["dra_claim_name"],
            s.labels["dra_device_name"],
            s.labels["dra_mig_device_uuid"],
        )
        for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="1")
    }
    name = "gpu-1-mig-1g10gb-19-{}".format
    assert got == {
        str(gi): (pod, ns, claim, name(truth[gi][1]), truth[gi][0])
        for gi, pod, ns, claim in (
            (7, "a", "ml", "mig-a"),
            (9, "b", "ml", "mig-b"),
            (13, "c", "lab", "mig-c"),
        )
    }


def test_a_tainted_device_names_the_pods_on_it(tmp_path):
    """The DRA driver taints the MIG instance of claim mig-b NoSchedule (XID 79) and GPU 0
    with an informational taint (effect None): only pod b is on an unhealthy device."""
    name = {9: "gpu-1-mig-1g10gb-19-2", 7: "gpu-1-mig-1g10gb-19-0"}
    taints = {
        name[9]: [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}],
        "gpu-0": [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}],
    }
    with dra_node(tmp_path, SIM_FLEET, "v1", taints) as (exp, doc, _):
        text = exp.wait_metrics(
            lambda t: "gpu_exporter_pod_device_unhealthy{" in t, 15, "the unhealthy family"
        )
    assert any("taints" in d for d in doc["spec"]["devices"])
    keys = ("gpu", "GPU_I_ID", "pod", "dra_claim_name", "dra_device_name", "source", "reason")
    got = [
        (*(s.labels[k] for k in keys), s.value)
        for s in find(text, "gpu_exporter_pod_device_unhealthy")
    ]
    assert got == [("1", "9", "b", "mig-b", name[9], "taint", "gpu.nvidia.com/xid=79", 1)]


def _pod(name: str, namespace: str, claim: str, device: str, health: str) -> dict:
    """A pod of this node whose container c reports its claim's device's health (KEP-4680)."""
    status = {"name": f"claim:{claim}/gpu", "resources": []}
    status["resources"] = [{"resourceID": f"gpu.nvidia.com/sim-node/{device}", "health": health}]
    container = {"name": "c", "containerID": f"containerd://{name}", "ready": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"nodeName": "sim-node", "containers": [{"name": "c"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{**container, "allocatedResourcesStatus": [status]}],
        },
    }


def test_the_pods_allocated_resources_status_names_an_unhealthy_device(tmp_path):
    """KEP-4680: the kubelet writes the DRA driver's health of a claim's device into the
    pod's status; pod c's MIG instance is Unhealthy, pod a's Healthy."""
    pods = [
        _pod("a", "ml", "mig-a", "gpu-1-mig-1g10gb-19-0", "Healthy"),
        _pod("c", "lab", "mig-c", "gpu-1-mig-1g10gb-19-6", "Unhealthy"),
    ]
    with dra_node(tmp_path, SIM_FLEET, "v1", pods=pods) as (exp, _, _):
        text = exp.wait_metrics(
            lambda t: "gpu_exporter_pod_device_unhealthy{" in t, 15, "the unhealthy family"
        )
    keys = ("gpu", "GPU_I_ID", "pod", "namespace", "dra_claim_name", "source", "reason")
    got = [
        tuple(s.labels[k] for k in keys) for s in find(text, "gpu_exporter_pod_device_unhealthy")
    ]
    assert got == [("1", "13", "c", "lab", "mig-c", "pod_status", "Unhealthy")]


CAPACITY_FLEET = """
hostname: sim-node
gpus:
  - model: NVIDIA H100 80GB HBM3
pods:
  - {name: a, namespace: ml, container: c, devices: ["gpu:0"], claim: big}
  - {name: b, namespace: lab, container: c, devices: ["gpu:0"], claim: small}
"""


def test_a_device_shared_by_consumable_capacity_is_split_by_it(tmp_path):
    """KEP-5075: GPU 0 under two claims in two namespaces, consuming 40960 and 8192 MiB of
    its memory: the exporter process (--simulate -k, the pod watch through KUBECONFIG)
    charges each pod its claim's part of the GPU's time and leaves the rest unallocated."""
    consumed = {("ml", "big"): 40960, ("lab", "small"): 8192}
    claims = [
        resource_claim(name, ns, "sim-node", "gpu-0", {"memory": f"{mib}Mi"})
        for (ns, name), mib in consumed.items()
    ]
    capacity = 'basis="capacity"'
    with dra_node(tmp_path, CAPACITY_FLEET, shared=("gpu-0",), claims=claims) as (exp, doc, _):
        exp.wait_metrics(lambda t: capacity in t, 15, "a split by capacity")
        first = _seconds(exp.metrics())
        second = _seconds(exp.wait_metrics(lambda t: _seconds(t)["all"] > first["all"] + 2, 15))
    memory = doc["spec"]["devices"][0]["capacity"]["memory"]["value"]
    assert memory.endswith("Mi")
    total = second["all"] - first["all"]
    for (_, claim), mib in consumed.items():
        pod = {"big": "a", "small": "b"}[claim]
        got = (second[pod] - first[pod]) / total
        assert got == pytest.approx(mib / float(memory[:-2]), rel=0.01), claim


def _seconds(text: str) -> dict[str, float]:
    """GPU 0's allocated seconds per pod, and its allocated plus unallocated ones ("all")."""
    out = {"all": 0.0}
    for s in samples(text):
        if s.labels.get("gpu") != "0":
            continue
        if s.name == "gpu_exporter_allocated_gpu_seconds_total":
            out[s.labels["pod"]] = out.get(s.labels["pod"], 0.0) + s.value
            out["all"] += s.value
        elif s.name == "gpu_exporter_unallocated_gpu_seconds_total":
            out["all"] += s.value
    return out
