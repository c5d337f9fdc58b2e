"""A device NVIDIA's DRA driver taints unhealthy fires GPUPodOnUnhealthyDevice for the pod
holding it: the exporter on the simulator (its kubelet serving DRA claims, the fake API
server the tainted ResourceSlice) is the input of a promtool unit test of the shipped
alerts/gpu-alerts.rules.yaml."""

from __future__ import annotations

import subprocess

import yaml

from tests.e2e.test_dra import SIM_FLEET
from tests.support.dranode import dra_node
from tests.support.exposition import find

ALERT = "GPUPodOnUnhealthyDevice"
FAMILY = "gpu_exporter_pod_device_unhealthy"


def _rule(alerts_dir):
    groups = yaml.safe_load((alerts_dir / "gpu-alerts.rules.yaml").read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == ALERT]
    return rule


def test_a_pod_on_a_tainted_device_fires_the_alert(tmp_path, promtool, alerts_dir):
    taint = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"}
    with dra_node(tmp_path, SIM_FLEET, "v1", {"gpu-0": [taint]}) as (exp, _, _):
        text = exp.wait_metrics(lambda t: f"{FAMILY}{{" in t, 15, "the unhealthy family")
    (series,) = find(text, FAMILY)
    scraped = {"job": "gpu-exporter", "instance": "10.0.0.1:9400", **series.labels}
    labels = ", ".join(f'{k}="{v}"' for k, v in scraped.items())
    rule = _rule(alerts_dir)
    kept = (
        "Hostname",
        "hostname",
        "gpu",
        "UUID",
        "namespace",
        "pod",
        "container",
        "dra_claim_name",
    )
    kept += ("dra_device_name", "source", "reason")
    expected = {**rule["labels"], **{k: scraped[k] for k in kept if k in scraped}}
    description = (
        f"Pod ml/whole (container c, claim whole-gpu) holds GPU 0 ({scraped['UUID']}) "
        "(gpu-0) on node sim-node, which its DRA driver marks unhealthy "
        "(taint: gpu.nvidia.com/gpu-lost)."
    )
    annotations = {
        "summary": rule["annotations"]["summary"],
        "description": description,
        "runbook_url": rule["annotations"]["runbook_url"],
    }
    test = {
        "rule_files": [str(alerts_dir / "gpu-alerts.rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"{FAMILY}{{{labels}}}", "values": "_x2 1x20"}],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": ALERT, "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": ALERT,
                        "exp_alerts": [{"exp_labels": expected, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "dra-unhealthy.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    p = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
