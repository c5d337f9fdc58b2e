"""The exporter started as dcgm-exporter 4.8.x users start it: NVIDIA's CSVs, a config
file, HPC job files that change while it runs, the sockets systemd passes, and
--health-require-gpus on a node whose driver comes late."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.procs import ROOT, STARTED, Exporter, wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures"
NVIDIA = FIXTURES / "csv" / "nvidia-4.8.2"


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.mark.parametrize(
    ("csv", "flags", "served"),
    [
        ("default-counters.csv", (), "DCGM_FI_DEV_GPU_TEMP"),
        ("dcp-metrics-included.csv", (), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
        ("1.x-compatibility-metrics.csv", ("-o",), "dcgm_fi_prof_pcie_tx_bytes"),
        ("1.x-compatibility-metrics.csv", (), "dcgm_gpu_temp"),  # names as written, no -o
    ],
)
def test_nvidia_482_csvs_start_and_name_every_row_not_served(csv, flags, served):
    exp = Exporter("-c", "500", "-f", str(NVIDIA / csv), *flags)
    try:
        exp.wait_ready()
        text = exp.wait_metrics(lambda t: series(t, served), 10, served)
    finally:
        log = exp.stop()
    assert "Traceback" not in log
    assert len(series(text, served)) == 17  # 6 whole GPUs and 11 MIG instances
    if csv == "1.x-compatibility-metrics.csv":  # one family, not two
        assert text.count(f"# TYPE {served} ") == 1
        assert "# TYPE DCGM_FI_" not in text  # every row under its 1.x name
        uuid = "uuid" if flags else "UUID"  # -o renames labels only
        assert all(f'{uuid}="GPU-' in s for s in series(text, served))
        assert sum("listed twice" in line for line in log.splitlines()) == 1
        assert "dcgm_fi_prof_pcie_rx_bytes (lines 19 and 66)" in log
    else:
        assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in log  # in the startup warning itself


@pytest.mark.parametrize("name", ["v1.yaml", "v2.yaml"])
def test_config_files_of_both_versions_start(name):
    exp = Exporter("--config-file", str(FIXTURES / "config" / name))
    try:
        exp.wait_ready()
        text = exp.metrics()
    finally:
        log = exp.stop()
    assert series(text, "DCGM_FI_DEV_GPU_TEMP") and "Traceback" not in log
    assert "collection fast-thermals: read every 5 s" in log
    assert "collecting every 30 s" in log


def test_hpc_job_files_change_while_it_runs(tmp_path):
    jobs = tmp_path / "jobs"
    exp = Exporter("-c", "300", "--hpc-job-mapping-dir", str(jobs))
    try:
        exp.wait_ready()
        jobs.mkdir()  # the directory appears after the start
        (jobs / "3").write_text("4242\n")
        text = exp.wait_metrics(lambda t: 'hpc_job="4242"' in t, 10, "job 4242")
        assert all('gpu="3"' in s for s in series(text, "DCGM_FI_DEV_GPU_TEMP") if "4242" in s)
        (jobs / "3").unlink()  # the job ended
        (jobs / "4").write_text("4343\n4344\n")
        text = exp.wait_metrics(lambda t: 'hpc_job="4242"' not in t and "4344" in t, 10, "4343")
        assert len([s for s in series(text, "DCGM_FI_DEV_GPU_TEMP") if 'gpu="4"' in s]) == 2
    finally:
        log = exp.stop()
    assert sum("cannot read it" in line for line in log.splitlines()) == 1  # logged once


def test_health_requires_a_collected_gpu():
    """/health answers 200 while GPUs are collected and 503 once none is (both lost); a
    node that sees no GPU at all answers 503 from the start. Without the flag, 200."""
    exp = Exporter(
        "-c", "500", "--health-require-gpus", fleet=FIXTURES / "fleets" / "gpus-lost.yaml"
    )
    try:
        exp.wait_ready(timeout=20)
        assert exp.get("/health")[0] == 200
        wait_until(lambda: exp.get("/health")[0] == 503, 15, "/health once no GPU is collected")
        assert exp.get("/health")[2] == b"no GPU is being collected\n"
    finally:
        exp.stop()
    for flags, want in ((["--health-require-gpus"], 503), ([], 200)):
        exp = Exporter("-c", "500", *flags, fleet=FIXTURES / "fleets" / "no-gpus.yaml")
        try:
            exp.wait_ready(timeout=20)  # ready with no GPU
            assert exp.get("/health")[0] == want, flags
        finally:
            exp.stop()


def test_listens_on_the_socket_systemd_passes():
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(16)
    port = listening.getsockname()[1]

    def as_systemd_does() -> None:  # in the child: the socket as fd 3
        os.dup2(listening.fileno(), 3)

    script = (
        'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -m exporter --simulate -c 500 --web-systemd-socket'
    )
    proc = subprocess.Popen(
        ["sh", "-c", script, sys.executable], cwd=ROOT, preexec_fn=as_systemd_does,
        close_fds=False,  # else fd 3 is closed after preexec_fn put the socket there
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    STARTED.append(proc)
    listening.close()  # only the exporter holds it now
    try:

        def ready() -> bool:
            try:
                return (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status
                    == 200
                )
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                return False

        wait_until(ready, 20, "the exporter on systemd's socket")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"DCGM_FI_DEV_GPU_TEMP{" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=10)[0].decode()
    assert "serving on the socket(s) systemd passed (fd 3)" in out


def test_without_the_sockets_systemd_passes_it_stops_at_once():
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "--simulate", "--web-systemd-socket"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "LISTEN_PID": "1", "LISTEN_FDS": "1"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 2 and time.monotonic() - t0 < 20
    assert p.stderr.count("\n") == 1 and "--web-systemd-socket: LISTEN_PID" in p.stderr
