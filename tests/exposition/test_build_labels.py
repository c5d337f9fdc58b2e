"""The DCGM series' label names under -o, and the empty pod labels of idle devices under -k."""

from __future__ import annotations

from exporter.catalog.metricsfile import parse
from exporter.config.model import Config, KubeConfig
from exporter.frame import Holder, Owner
from tests.exposition.test_build import gpu, snap
from tests.support.exposition import Stages, samples

ROWS = "dcgm_gpu_temp, gauge, t\nDCGM_FI_DEV_FB_USED, gauge, f\n"
CATALOG = parse(ROWS + "DCGM_EXP_XID_ERRORS_TOTAL, counter, x\n", "m.csv")


def _series(cfg: Config) -> dict[tuple[str, str], dict[str, str]]:
    """(metric, gpu) -> labels of the 1.x-named temperature and FB rows of two GPUs,
    GPU 0 held by a pod and GPU 1 by nobody."""
    g0, g1 = gpu(0), gpu(1)
    values = {g.key: {"DCGM_FI_DEV_GPU_TEMP": 40, "DCGM_FI_DEV_FB_USED": 1.0} for g in (g0, g1)}
    holder = Holder(Owner("ns", "train-0", "main"), "", ())
    st = Stages(cfg)
    st.publish(snap([g0, g1], values=values), CATALOG, {g0.key: holder})
    return {(s.name, s.labels["gpu"]): s.labels for s in samples(st.text)}


def test_names_as_written_and_labels_as_dcgm_exporter_writes_them():
    got = _series(Config(kube=KubeConfig("node-a", "/none")))
    held, idle = got[("dcgm_gpu_temp", "0")], got[("dcgm_gpu_temp", "1")]
    assert held["UUID"] == "GPU-0" and "uuid" not in held
    assert (held["pod"], held["namespace"], held["container"]) == ("train-0", "ns", "main")
    assert ("DCGM_FI_DEV_FB_USED", "1") in got and ("DCGM_FI_DEV_GPU_TEMP", "0") not in got
    # -k: a device no container holds carries each pod label, empty (honor_labels keeps
    # the scrape target's pod off it); Prometheus stores an empty label as absent
    assert (idle["pod"], idle["namespace"], idle["container"]) == ("", "", "")


def test_old_names_rename_labels_not_metrics():
    got = _series(Config(old_names=True, kube=KubeConfig("node-a", "/none")))
    held, idle = got[("dcgm_gpu_temp", "0")], got[("DCGM_FI_DEV_FB_USED", "1")]
    assert held["uuid"] == "GPU-0" and "UUID" not in held
    assert (held["pod_name"], held["pod_namespace"], held["container_name"]) == (
        "train-0",
        "ns",
        "main",
    )
    assert not {"pod", "namespace", "container"} & set(held)
    assert (idle["pod_name"], idle["pod_namespace"], idle["container_name"]) == ("", "", "")


def test_without_k_no_pod_labels_on_idle_devices():
    got = _series(Config())
    assert "pod" not in got[("dcgm_gpu_temp", "1")]


def test_xid_counts_of_an_idle_device_carry_empty_pod_labels_under_k():
    st = Stages(Config(kube=KubeConfig("node-a", "/none")))
    g = gpu(0)
    s = snap([g], values={g.key: {}}, counts=[(g.uuid, None, None, 43, 2)])
    st.publish(s, CATALOG)
    xid = [x for x in samples(st.text) if x.name == "DCGM_EXP_XID_ERRORS_TOTAL"]
    assert xid and all(x.labels["pod"] == "" for x in xid), st.text
