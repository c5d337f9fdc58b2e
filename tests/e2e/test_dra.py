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

from tests.procs import Exporter
from tests.support.exposition import find
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
    text = node.wait_metrics(lambda t: 'claim_name="small-mig"' in t, 15, "DRA labels")
    whole = find(text, "DCGM_FI_DEV_FB_USED", gpu="3")
    assert [(s.labels["pod"], s.labels["namespace"], s.labels["container"]) for s in whole] == [
        ("dra-whole", "ml", "trainer")
    ]
    assert (
        whole[0].labels["claim_name"] == "whole-gpu" and whole[0].labels["claim_namespace"] == "ml"
    )
    temp = find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    assert temp[0].labels["pod"] == "dra-whole"  # device-level series of a whole GPU too
    mig = [s for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7") if s.labels.get("GPU_I_ID") == "7"]
    assert [(s.labels["pod"], s.labels["claim_name"]) for s in mig] == [("dra-mig", "small-mig")]
    # dynamic MIG: the slice names the parent GPU and profile (3g.40gb is GI 2 on GPU 7)
    dyn = [s for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7") if s.labels.get("GPU_I_ID") == "2"]
    assert [(s.labels["pod"], s.labels["claim_name"]) for s in dyn] == [
        ("dra-dynamic", "dynamic-mig")
    ]
    # the other MIG instances of GPU 7, and GPU 7's device series, stay unlabelled
    others = [
        s
        for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="7")
        if s.labels.get("GPU_I_ID") not in ("7", "2")
    ]
    assert others and all(not s.labels.get("pod") for s in others)  # -k: pod=""
    assert "fpga" not in text  # other drivers' claims are not ours
