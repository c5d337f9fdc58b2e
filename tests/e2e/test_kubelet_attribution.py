"""End to end: the exporter with -k against the fake kubelet, through /metrics and /ready."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.procs import Exporter, wait_until
from tests.support.exposition import find, without_holders
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", load_pods("default-node.yaml", fleet_ids(None)))
    k.start()
    yield k
    k.close()


def start(kubelet, *extra):
    exp = Exporter(
        "-c", "300", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path), *extra
    )
    exp.wait_ready()
    return exp


def owners(text, name="DCGM_FI_DEV_FB_USED"):
    """(namespace, pod, container) per device; None for an empty label (-k gives a device
    no workload holds pod="", ..., which Prometheus stores as absent)."""
    return {
        (s.labels["gpu"], s.labels.get("GPU_I_ID")): (
            s.labels.get("namespace") or None,
            s.labels.get("pod") or None,
            s.labels.get("container") or None,
        )
        for s in find(text, name)
    }


def test_whole_gpus_and_mig_instances_get_their_pod(kubelet):
    exp = start(kubelet)
    try:
        text = exp.wait_metrics(lambda t: 'pod="train-0"' in t, 10, "pod labels")
        o = owners(text)
        assert o[("0", None)] == ("ml", "train-0", "trainer")
        assert o[("2", None)] == o[("3", None)] == ("serving", "infer-2", "server")
        assert o[("4", None)] == ("ml", "gke-job", "main")
        assert o[("6", "7")] == ("research", "mig-small-0", "notebook")
        assert o[("6", "8")] == ("research", "mig-small-1", "notebook")
        assert o[("7", "2")] == ("research", "mig-large", "trainer")
        assert o[("7", "7")] == ("research", "mig-gke", "job")
        assert o[("6", "9")] == (None, None, None)  # unallocated instance
        # shared GPUs keep device series free of pod labels
        assert o[("1", None)] == (None, None, None)
        assert o[("5", None)] == (None, None, None)
        temps = {
            (s.labels["gpu"], s.labels.get("GPU_I_ID")): s.labels.get("pod") or None
            for s in find(text, "DCGM_FI_DEV_GPU_TEMP")
        }
        assert temps[("0", None)] == "train-0" and temps[("1", None)] is None
        assert temps[("6", "7")] == "mig-small-0" and ("6", None) not in temps  # per instance
        # the stale ID is counted, not silently dropped
        un = find(text, "gpu_exporter_unmatched_device_ids_total", resource="nvidia.com/gpu")
        assert un and un[0].value >= 1
        assert find(text, "gpu_exporter_kubelet_up")[0].value == 1
        assert find(text, "gpu_exporter_collector_success", collector="podresources")[0].value == 1
    finally:
        exp.stop()


def test_the_kubelet_client_loads_no_grpc(kubelet):
    exp = start(kubelet)
    try:
        exp.wait_metrics(lambda t: 'pod="train-0"' in t, 10, "pod labels")
        pid = exp.proc.pid
        maps = Path(f"/proc/{pid}/maps").read_text()
        threads = [p.read_text().strip() for p in Path(f"/proc/{pid}/task").glob("*/comm")]
    finally:
        exp.stop()
    assert "cygrpc" not in maps  # grpcio's core library is never loaded
    assert not [t for t in threads if "grpc" in t]  # nor its threads started


def test_pod_deleted_loses_labels_within_one_interval(kubelet):
    exp = start(kubelet)
    try:
        wait_until(lambda: 'pod="train-0"' in exp.metrics(), 10, "pod labels")
        del kubelet.pods.pod_resources[0]  # train-0 ends
        text = exp.wait_metrics(
            lambda t: 'pod="train-0"' not in without_holders(t), 2, "labels gone"
        )
        assert owners(text)[("0", None)] == (None, None, None)
        # GPU accounting keeps the ended pod's final values for its retention
        assert find(text, "gpu_exporter_allocated_gpu_seconds_total", pod="train-0")
    finally:
        exp.stop()


def test_kubelet_restart_and_missing_socket(kubelet):
    exp = start(kubelet)
    try:
        wait_until(lambda: 'pod="train-0"' in exp.metrics(), 10, "pod labels")
        kubelet.restart()
        calls = kubelet.calls
        wait_until(lambda: kubelet.calls > calls + 2, 10, "the exporter to reconnect")
        assert 'pod="train-0"' in exp.metrics()
        kubelet.stop()  # socket removed: still ready, and /ready says why labels are off
        wait_until(lambda: b"does not exist" in exp.get("/ready")[2], 10, "/ready to say why")
        status, _, body = exp.get("/ready")
        assert status == 200 and b"pod labels off" in body
        # /ready reads the mapper's state as it is; the exposition follows once this
        # cycle's render (in the worker thread, after the refresh) is published
        wait_until(
            lambda: find(exp.metrics(), "gpu_exporter_kubelet_up")[0].value == 0,
            10,
            "gpu_exporter_kubelet_up 0",
        )
    finally:
        exp.stop()


def test_no_socket_at_start(tmp_path):
    exp = Exporter("-c", "300", "-k", "--pod-resources-kubelet-socket", str(tmp_path / "none.sock"))
    try:
        exp.wait_ready()
        status, _, body = exp.get("/ready")
        assert status == 200 and b"does not exist" in body
        text = exp.metrics()
        assert 'pod="' in text and 'pod=""' in text  # every device idle: empty pod labels
        assert not re.search(r'\bpod="[^"]', text)
    finally:
        log = exp.stop()
    assert log.count("does not exist") == 1  # said once
