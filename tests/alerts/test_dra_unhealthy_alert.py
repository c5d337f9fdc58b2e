"""A device NVIDIA's DRA driver taints unhealthy fires GPUPodOnUnhealthyDevice for the pod
holding it: the exporter on the simulator (its kubelet serving DRA claims, the fake API
server the tainted ResourceSlice) is the input of a promtool unit test of the shipped
alerts/gpu-alerts.rules.yaml."""

from __future__ import annotations

from tests.e2e.test_dra import SIM_FLEET
from tests.support.dranode import dra_node
from tests.support.exposition import find
from tests.support.promtest import TARGET, assert_fires

ALERT = "GPUPodOnUnhealthyDevice"
FAMILY = "gpu_exporter_pod_device_unhealthy"


def test_a_pod_on_a_tainted_device_fires_the_alert(tmp_path, promtool, alerts_dir):
    taint = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"}
    with dra_node(tmp_path, SIM_FLEET, "v1", {"gpu-0": [taint]}) as (exp, _, _):
        text = exp.wait_metrics(lambda t: f"{FAMILY}{{" in t, 15, "the unhealthy family")
    (series,) = find(text, FAMILY)
    scraped = {**TARGET, **series.labels}
    kept = (
        "Hostname",
        "hostname",
        "gpu",
        "UUID",
        "namespace",
        "pod",
        "container",
        "dra_claim_name",
        "dra_device_name",
        "source",
        "reason",
    )
    description = (
        f"Pod ml/whole (container c, claim whole-gpu) holds GPU 0 ({scraped['UUID']}) "
        "(gpu-0) on node sim-node, which its DRA driver marks unhealthy "
        "(taint: gpu.nvidia.com/gpu-lost)."
    )
    expected = {k: scraped[k] for k in kept if k in scraped}
    assert_fires(
        promtool,
        tmp_path,
        alerts_dir,
        ALERT,
        (FAMILY, scraped, "_x2 1x20"),
        ("3m", "5m"),
        expected,
        description,
    )
