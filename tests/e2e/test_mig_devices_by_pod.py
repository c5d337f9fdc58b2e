"""End to end with the fake kubelet: MIG pods answer device-level queries by pod (-d f)."""

from __future__ import annotations

import pytest

from tests.procs import Exporter
from tests.support.exposition import find
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", load_pods("default-node.yaml", fleet_ids(None)))
    k.start()
    yield k
    k.close()


def test_mig_pod_power_by_pod(kubelet):
    exp = Exporter("-c", "300", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path))
    try:
        exp.wait_ready()
        text = exp.wait_metrics(lambda t: 'pod="mig-small-0"' in t, 10, "pod labels")
    finally:
        exp.stop()
    power = find(text, "DCGM_FI_DEV_POWER_USAGE", pod="mig-small-0")
    assert [(s.labels["gpu"], s.labels["GPU_I_ID"]) for s in power] == [("6", "7")]
    assert power[0].labels["namespace"] == "research"
    assert power[0].labels["GPU_I_PROFILE"]
    large = find(text, "DCGM_FI_DEV_POWER_USAGE", pod="mig-large")
    assert [(s.labels["gpu"], s.labels["GPU_I_ID"]) for s in large] == [("7", "2")]
    # the parent's value, repeated per GPU instance; no separate parent series
    gpu6 = find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="6")
    assert len(gpu6) == 7 and all("GPU_I_ID" in s.labels for s in gpu6)
    assert {s.value for s in gpu6} == {power[0].value}
    # the same for the other device-level fields a dashboard asks by pod
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP"):
        assert find(text, name, pod="mig-small-0"), name
