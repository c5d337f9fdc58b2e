"""--hpc-job-mapping-dir: job files as Slurm's prolog and epilog write them, read every
cycle; each series of a GPU or MIG instance with a file is copied per job (dcgm-exporter's
hpc_job label), a device without one keeps its plain series."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Config, default_metrics_file
from exporter.poller import Poller
from exporter.workloads.hpcjobs import MAX_ID_CHARS, MAX_JOBS, JobFiles
from tests.support.exposition import find

CATALOG = load(default_metrics_file())


def test_job_files_by_gpu_and_gpu_instance(tmp_path):
    (tmp_path / "0").write_text("1001\n 1002 \n\n1001\n")
    (tmp_path / "2.3").write_text("2001")
    (tmp_path / "notes.txt").write_text("not a job file")
    (tmp_path / "4").mkdir()
    (tmp_path / "5").write_text("")  # a GPU without jobs: no copies
    got = JobFiles(str(tmp_path)).read(["0", "2.3", "4", "5", "notes.txt", "6"])
    assert dict(got) == {"0": ("1001", "1002"), "2.3": ("2001",)}


def test_job_files_are_bounded(tmp_path, caplog):
    (tmp_path / "0").write_text("".join(f"job{i}\n" for i in range(MAX_JOBS + 10)))
    (tmp_path / "1").write_text("x" * (MAX_ID_CHARS + 1) + "\nok\tjob\x1b\n")
    (tmp_path / "2").write_bytes(b"big\n" * 20000)  # 80 KB: over the file bound
    os.mkfifo(tmp_path / "3")  # never blocks the cycle
    with caplog.at_level(logging.WARNING):
        got = JobFiles(str(tmp_path)).read(["0", "1", "2", "3"])
    assert len(got["0"]) == MAX_JOBS
    assert got["1"] == ("ok_job_",)  # control characters become _
    assert "2" not in got and "3" not in got
    assert 1 <= len(caplog.records) <= 2  # one warning a minute, not one per file


def test_missing_directory_is_logged_once(tmp_path, caplog):
    jobs = JobFiles(str(tmp_path / "jobs"))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert jobs.read(["1"]) == {}
        (tmp_path / "jobs").mkdir()
        (tmp_path / "jobs" / "1").write_text("7\n")
        assert jobs.read(["1"]) == {"1": ("7",)}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "cannot read it" in lines[0] and "found" in lines[1]


def test_a_link_to_a_file_the_writer_cannot_read_is_not_published(tmp_path, caplog):
    """The exporter reads as root: a symbolic link named like a device, to a root-only
    file, must not publish that file's content; nor a hard link to another's file."""
    secret = tmp_path / "secret"
    secret.write_text("root-only-content\n")
    secret.chmod(0o600)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").symlink_to(secret)
    os.link(secret, jobs / "1")
    (jobs / "2").write_text("ok\n")
    with caplog.at_level(logging.WARNING):
        got = JobFiles(str(jobs)).read(["0", "1", "2"])
    assert dict(got) == {"2": ("ok",)}
    assert caplog.records and "root-only-content" not in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_of_another_owner_is_refused(tmp_path):
    """Only root's files and those of the directory's owner are read."""
    os.chown(tmp_path, 1000, 1000)
    for name, uid in (("0", 0), ("1", 1000), ("2", 1001)):
        (tmp_path / name).write_text(f"job{uid}\n")
        os.chown(tmp_path / name, uid, uid)
    assert dict(JobFiles(str(tmp_path)).read(["0", "1", "2"])) == {
        "0": ("job0",),
        "1": ("job1000",),
    }


def test_junk_files_do_not_hide_a_device_file(tmp_path):
    """Names are looked up, not listed: 20,000 other files beside ``0`` change nothing."""
    for i in range(20000):
        (tmp_path / f"junk{i:05}").touch()
    for i in range(1000, 3000):  # names that could be devices, but of no device here
        (tmp_path / str(i)).write_text("x\n")
    (tmp_path / "0").write_text("1001\n")
    assert dict(JobFiles(str(tmp_path)).read(["0", "1"])) == {"0": ("1001",)}


@pytest.fixture
def node(tmp_path):
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config(hpc_job_dir=str(tmp_path)))
    try:
        yield tmp_path, lambda: (poller.publish(col.collect()), poller.builder.dcgm_text)[1]
    finally:
        col.close(0.5)
        poller.close()
        sim.uninstall()


def test_job_ids_utf8_cannot_carry_are_exported_as_u_fffd(node):
    """Bytes no UTF-8 decoder accepts (a surrogate as CESU-8 writes it, a stray
    continuation byte): each becomes U+FFFD in hpc_job; the cycle and its text go on."""
    jobs, cycle = node
    (jobs / "0").write_bytes(b"j\xed\xa0\x80b\nk\x80\n")
    got = {s.labels["hpc_job"] for s in find(cycle(), "DCGM_FI_DEV_GPU_TEMP", gpu="0")}
    assert got == {"j\ufffd\ufffd\ufffdb", "k\ufffd"}


def test_series_copied_per_job_while_the_directory_changes(node):
    jobs, cycle = node
    plain = cycle()
    temps = find(plain, "DCGM_FI_DEV_GPU_TEMP")
    mig = next(s for s in temps if "GPU_I_ID" in s.labels)  # an instance of a MIG GPU
    mig_file = f"{mig.labels['gpu']}.{mig.labels['GPU_I_ID']}"
    assert not any("hpc_job" in s.labels for s in temps)

    (jobs / "0").write_text("1001\n1002\n")  # prolog of two jobs sharing GPU 0
    (jobs / mig_file).write_text("2001\n")
    text = cycle()
    gpu0 = find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert sorted(s.labels["hpc_job"] for s in gpu0) == ["1001", "1002"]  # no plain series
    assert len({s.value for s in gpu0}) == 1
    inst = find(text, "DCGM_FI_DEV_FB_USED", gpu=mig.labels["gpu"], GPU_I_ID=mig.labels["GPU_I_ID"])
    assert [s.labels["hpc_job"] for s in inst] == ["2001"]
    # the instance's copy of a device-level field too, and no other device has jobs
    assert [s.labels.get("hpc_job") for s in find(text, "DCGM_FI_DEV_GPU_TEMP",
            gpu=mig.labels["gpu"], GPU_I_ID=mig.labels["GPU_I_ID"])] == ["2001"]  # fmt: skip
    others = [s for s in find(text, "DCGM_FI_DEV_GPU_TEMP") if s.labels["gpu"] not in ("0",)]
    assert sum("hpc_job" in s.labels for s in others) == 1
    assert len(find(text, "DCGM_FI_DEV_GPU_TEMP")) == len(temps) + 1

    (jobs / "0").unlink()  # epilog: the jobs ended
    (jobs / "1").write_text("1003\n")
    text = cycle()
    assert [s.labels.get("hpc_job") for s in find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")] == [None]
    assert [s.labels["hpc_job"] for s in find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1")] == ["1003"]


def test_no_copies_without_the_flag(tmp_path: Path):
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config())
    try:
        assert poller.job_files is None and poller.workloads(col.collect()) is None
    finally:
        col.close(0.5)
        poller.close()
        sim.uninstall()
