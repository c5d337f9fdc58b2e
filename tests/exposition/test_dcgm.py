"""exposition/dcgm.py through the stages: the XID counts keep their holder's pod labels,
a family with no sample this cycle is not served at all, and every family follows a
GPU's copies (one per HPC job)."""

from __future__ import annotations

import re

from exporter import sim
from exporter.collector import Collector
from exporter.config.model import Config, KubeConfig
from exporter.frame import Holder, Owner
from exporter.poller import Poller
from tests.exposition.test_build import CATALOG, gpu, snap
from tests.support.exposition import Stages, samples

COUNTS = "DCGM_EXP_XID_ERRORS_TOTAL"
POD = ("pod", "namespace", "container")


def _xid_counts(stages: Stages, holders=None) -> dict[str, dict[str, str]]:
    g0, g1 = gpu(0), gpu(1)
    counts = [(g0.uuid, None, None, 13, 2), (g1.uuid, None, None, 79, 1)]
    stages.publish(snap([g0, g1], counts=counts), CATALOG, holders)
    return {s.labels["gpu"]: s.labels for s in samples(stages.text) if s.name == COUNTS}


def test_xid_counts_carry_the_pod_labels_of_the_container_holding_the_gpu() -> None:
    """A user summing XIDs by pod finds GPU 1's under the pod holding it, GPU 0's under
    none; the counts and codes are the snapshot's."""
    held = {gpu(1).key: Holder(Owner("ml", "train-0", "trainer"))}
    got = _xid_counts(Stages(), held)
    assert [got["1"][k] for k in POD] == ["train-0", "ml", "trainer"]
    assert got["1"]["xid"] == "79" and got["0"]["xid"] == "13"
    assert not any(k in got["0"] for k in POD)
    stages = Stages()
    stages.publish(snap([gpu(0), gpu(1)], counts=[(gpu(1).uuid, None, None, 79, 3)]), CATALOG, held)
    (s,) = [s for s in samples(stages.text) if s.name == COUNTS]
    assert (s.labels["pod"], s.value) == ("train-0", 3.0)


def test_with_k_xid_counts_of_an_unheld_gpu_carry_empty_pod_labels() -> None:
    """-k: pod="" blocks a scrape's honor_labels from naming the exporter's own pod."""
    stages = Stages(Config(kube=KubeConfig("node-a", "/none")))
    held = {gpu(1).key: Holder(Owner("ml", "train-0", "trainer"))}
    got = _xid_counts(stages, held)
    assert [got["0"].get(k) for k in POD] == ["", "", ""]
    assert got["1"]["pod"] == "train-0"


def test_a_family_with_no_sample_this_cycle_is_not_served() -> None:
    """Only the GPU temperature was read: every family served has at least one sample
    (no HELP/TYPE lines without samples), and the families without readings are absent."""
    g = gpu(0)
    stages = Stages()
    n = stages.publish(snap([g], values={g.key: {"DCGM_FI_DEV_GPU_TEMP": 40}}), CATALOG)
    body = stages.text
    typed = re.findall(r"^# TYPE (\S+) ", body, re.M)
    with_samples = {s.name for s in samples(body)}
    assert typed and set(typed) == with_samples
    assert "DCGM_FI_DEV_GPU_TEMP" in typed and "DCGM_FI_DEV_XID_ERRORS" in typed
    absent = {"DCGM_FI_DEV_FB_USED", COUNTS, "DCGM_EXP_GPU_HEALTH_STATUS"}
    assert not absent & set(typed)
    assert n == len(samples(body))


def test_each_hpc_job_on_a_gpu_gets_its_own_copy_of_the_gpus_xid_series(tmp_path) -> None:
    """The DCGM_EXP_* and XID families follow the plain fields: one series per job
    (dcgm-exporter's hpc_job label), not one for the GPU without it."""
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config(hpc_job_dir=str(tmp_path)))
    try:
        (tmp_path / "0").write_text("job-a\njob-b\n")
        poller.publish(col.collect())
        body = poller.builder.dcgm_text
    finally:
        col.close(0.5)
        poller.close()
        sim.uninstall()
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"):
        jobs = [s.labels.get("hpc_job") for s in samples(body) if s.name == name]
        assert sorted(j for j in jobs if j) == ["job-a", "job-b"], name


def test_when_a_gpus_jobs_change_its_xid_series_follow_the_next_cycle(tmp_path) -> None:
    """GPU 0 runs job-a and job-b, then job-c: the next cycle's last-XID series (written
    from the same devices and XIDs) carry job-c only, not the last cycle's jobs."""
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config(hpc_job_dir=str(tmp_path)))
    got = []
    try:
        for jobs in ("job-a\njob-b\n", "job-c\n"):
            (tmp_path / "0").write_text(jobs)
            poller.publish(col.collect())
            body = poller.builder.dcgm_text
            got.append(
                sorted(
                    s.labels["hpc_job"]
                    for s in samples(body)
                    if s.name == "DCGM_FI_DEV_XID_ERRORS" and s.labels.get("hpc_job")
                )
            )
    finally:
        col.close(0.5)
        poller.close()
        sim.uninstall()
    assert got == [["job-a", "job-b"], ["job-c"]]
