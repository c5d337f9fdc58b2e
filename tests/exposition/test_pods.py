"""Pod labels on a device's series, as dcgm-exporter copies them
(--kubernetes-enable-pod-labels, --kubernetes-pod-label-allowlist-regex) and as our
--kubernetes-pod-labels does (label_<name>): a real kubelet on a unix socket, a real
HTTP API server, the exporter's Attribution in this process."""

from __future__ import annotations

import asyncio
import json

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import KubeConfig, default_metrics_file
from exporter.exposition.pods import HolderText
from exporter.workloads.attribution import Attribution
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakeapi import load as load_api
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods


@pytest.fixture(scope="module")
def snap():
    sim.install(None)
    col = Collector(load(default_metrics_file()), "n")
    try:
        return col.collect()
    finally:
        col.close()
        sim.uninstall()


@pytest.fixture
def node(tmp_path, monkeypatch):
    kubelet = FakeKubelet(
        tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None))
    ).start()
    api = FakeAPIServer(load_api("pods.yaml")).start()
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
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
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    yield kubelet
    api.stop()
    kubelet.close()


async def labels_of(node, snap, **kw) -> str:
    """The label text of GPU 0 (held by train-0) once the pod's labels arrived."""
    attr = Attribution(KubeConfig("node-a", str(node.socket_path), **kw))
    try:
        for _ in range(200):
            await attr.refresh(snap)
            holder = attr.holders().get(snap.gpus[0].key)
            text = HolderText()(holder) if holder is not None else ""
            if attr.watcher.pods_synced and text:
                return text
            await asyncio.sleep(0.05)
        raise AssertionError(f"no labels for GPU 0: {attr.details()}")
    finally:
        await attr.close()


async def test_dcgm_style_labels_with_allowlist(node, snap):
    text = await labels_of(
        node, snap, dcgm_pod_labels=True, pod_label_allowlist=("^app\\.", "^team$")
    )
    assert 'pod="train-0"' in text
    assert 'app_kubernetes_io_name="trainer"' in text
    assert 'app_kubernetes_io_instance="llama-ft"' in text
    assert 'team="ml"' in text
    assert "pod_template_hash" not in text and "label_" not in text


async def test_dcgm_style_labels_without_allowlist_copy_all(node, snap):
    text = await labels_of(node, snap, dcgm_pod_labels=True)
    assert 'pod_template_hash="7d9f5c6b8"' in text
    assert 'statefulset_kubernetes_io_pod_name="train-0"' in text


async def test_our_prefixed_labels_keep_working(node, snap):
    text = await labels_of(node, snap, pod_labels="team|app.kubernetes.io/name")
    assert 'label_team="ml"' in text and 'label_app_kubernetes_io_name="trainer"' in text
    assert 'team="ml"' not in text.replace("label_team", "")
