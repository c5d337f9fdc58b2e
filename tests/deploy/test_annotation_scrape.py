"""Without prometheus-operator: a real Prometheus scrapes the simulated exporter with the job
of deploy/prometheus/scrape-config.yaml, beside the prometheus-community chart's annotation
job ("kubernetes-pods", honor_labels: true, the target's pod/namespace/node labels).

Kubernetes service discovery is replaced by static targets carrying the ``__meta_kubernetes_*``
labels it would give the exporter's pod, taken from the rendered without-prometheus-operator
manifests; both jobs' relabelings run unchanged on them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.procs import Exporter, Prometheus, require, wait_until

POD = "gpu-exporter-x7k2p"
NODE = "gpu-node-1"

# The prometheus-community "prometheus" chart's kubernetes-pods job, relabelings as it ships them.
CHART_JOB: dict[str, Any] = {
    "job_name": "kubernetes-pods",
    "honor_labels": True,
    "relabel_configs": [
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "action": "keep",
            "regex": "true",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape_slow"],
            "action": "drop",
            "regex": "true",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
            "action": "replace",
            "target_label": "__metrics_path__",
            "regex": "(.+)",
        },
        {
            "source_labels": [
                "__meta_kubernetes_pod_annotation_prometheus_io_port",
                "__meta_kubernetes_pod_ip",
            ],
            "action": "replace",
            "regex": r"(\d+);((([0-9]+?)(\.|$)){4})",
            "replacement": "$2:$1",
            "target_label": "__address__",
        },
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
        {
            "source_labels": ["__meta_kubernetes_namespace"],
            "action": "replace",
            "target_label": "namespace",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_name"],
            "action": "replace",
            "target_label": "pod",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "Pending|Succeeded|Failed|Completed",
            "action": "drop",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_node_name"],
            "action": "replace",
            "target_label": "node",
        },
    ],
}


def _name(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", s)


def _meta(objs: list[dict[str, Any]], port: int, **annotations: str) -> dict[str, str]:
    """The labels Kubernetes pod discovery gives the exporter's metrics port."""
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    tmpl = ds["spec"]["template"]
    (container,) = tmpl["spec"]["containers"]
    (cport,) = container["ports"]
    out = {
        "__meta_kubernetes_namespace": ds["metadata"]["namespace"],
        "__meta_kubernetes_pod_name": POD,
        "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_node_name": NODE,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": cport["name"],
        "__meta_kubernetes_pod_container_port_number": str(port),
    }
    for k, v in tmpl["metadata"].get("labels", {}).items():
        out[f"__meta_kubernetes_pod_label_{_name(k)}"] = v
    for k, v in {**tmpl["metadata"].get("annotations", {}), **annotations}.items():
        out[f"__meta_kubernetes_pod_annotation_{_name(k)}"] = v
    return out


def _static(job: dict[str, Any], port: int, labels: dict[str, str], name: str) -> dict[str, Any]:
    job = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    job |= {"job_name": name, "scrape_interval": "1s", "scrape_timeout": "1s"}
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"], "labels": labels}]
    return job


@pytest.fixture(scope="module")
def prom(rendered, tmp_path_factory):
    require("prometheus", "prometheus")
    objs = rendered["without-prometheus-operator"]
    (ours,) = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())
    work = tmp_path_factory.mktemp("annotation-scrape")
    exp = Exporter("-c", "300")
    kube = Exporter("-c", "300", "-k")  # the simulated node's pods hold some of its GPUs
    exp.wait_ready()
    kube.wait_ready()
    meta = _meta(objs, exp.port)
    annotated = _meta(
        objs, exp.port, **{"prometheus.io/scrape": "true", "prometheus.io/port": str(exp.port)}
    )
    annotated_k = _meta(
        objs, kube.port, **{"prometheus.io/scrape": "true", "prometheus.io/port": str(kube.port)}
    )
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            _static(ours, exp.port, meta, "gpu-exporter"),
            _static(CHART_JOB, exp.port, meta, "kubernetes-pods"),
            # The same chart job on a pod that had the annotation: what the manifests avoid.
            _static(CHART_JOB, exp.port, annotated, "annotated-control"),
            # The same, scraping an exporter run with -k: idle GPUs carry pod="" and so on.
            _static(CHART_JOB, kube.port, annotated_k, "annotated-k"),
        ],
    }
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    p = Prometheus(path, work)
    try:
        wait_until(
            lambda: (
                p.query('up{job="gpu-exporter"} == 1')
                and p.query('up{job="annotated-control"} == 1')
                and p.query('DCGM_FI_DEV_GPU_TEMP{job="gpu-exporter"}')
                and p.query('DCGM_FI_DEV_GPU_TEMP{job="annotated-k", pod!=""}')
            ),
            30,
            "both scrapes",
        )
        yield p
    finally:
        p.stop()
        exp.stop()
        kube.stop()


def test_the_manifests_pod_is_not_an_annotation_target(rendered):
    (ds,) = [o for o in rendered["without-prometheus-operator"] if o["kind"] == "DaemonSet"]
    notes = ds["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(k.startswith("prometheus.io/") for k in notes)


def test_no_series_carries_the_exporters_pod(prom):
    assert prom.query(f'{{job="gpu-exporter", pod="{POD}"}}') == []
    assert prom.query('{job="gpu-exporter", namespace="gpu-exporter"}') == []
    gpus = prom.query('DCGM_FI_DEV_GPU_TEMP{job="gpu-exporter"}')
    assert len(gpus) == 17  # 6 whole GPUs and the 11 MIG instances of 2 GPUs (-d f)
    assert {r["metric"]["node"] for r in gpus} == {NODE}


def test_the_chart_job_scrapes_nothing_of_ours(prom):
    assert prom.query('up{job="kubernetes-pods"}') == []


def test_an_annotated_pod_would_name_the_exporter_on_idle_gpus(prom):
    """The control: the annotation job on an annotated pod puts the exporter's pod on GPU
    series no workload holds, which is why the manifests leave the annotation out."""
    res = prom.query(f'DCGM_FI_DEV_GPU_TEMP{{job="annotated-control", pod="{POD}"}}')
    assert len(res) == 17  # every series: none is held by a workload here


def test_with_k_no_gpu_carries_the_exporters_pod_under_honor_labels(prom):
    """-k: a device no workload holds carries pod="", namespace="", container="", which
    honor_labels keeps over the target's labels and Prometheus stores as absent."""
    temps = prom.query('DCGM_FI_DEV_GPU_TEMP{job="annotated-k"}')
    assert len(temps) == 17
    dcgm = '__name__=~"DCGM_.*"'  # the exporter's own gpu_exporter_* families are its pod's
    assert prom.query(f'{{job="annotated-k", {dcgm}, pod="{POD}"}}') == []
    assert prom.query(f'{{job="annotated-k", {dcgm}, namespace="gpu-exporter"}}') == []
    assert prom.query(f'{{job="annotated-k", {dcgm}}}')  # the DCGM families are there
    held = [r for r in temps if r["metric"].get("pod")]
    idle = [r for r in temps if "pod" not in r["metric"]]
    assert held and idle and len(held) + len(idle) == 17  # empty labels are stored absent
    assert not any("namespace" in r["metric"] or "container" in r["metric"] for r in idle)
