"""What a start validates: a metrics file with a name DCGM does not know stops the start and
fails --check, as dcgm-exporter's "could not find DCGM field" does (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_resolve import check, run
from tests.procs import free_port

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


@pytest.mark.parametrize("how", ["start", "check"])
def test_a_typo_stops_the_start_naming_file_line_and_the_field_meant(how):
    path = FIXTURES / "unknown-field.csv"
    if how == "check":
        p = check("-f", str(path))
    else:
        p = run("--simulate", "-a", f"127.0.0.1:{free_port()}", "-f", str(path))
    assert p.returncode == 2, (p.stdout, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, p.stderr
    assert f"{path}:2: 'DCGM_FI_DEV_GPU_TEMPERATURE' is not a DCGM field" in errors[0]
    assert "did you mean DCGM_FI_DEV_GPU_TEMP?" in errors[0]
    assert "ok" not in p.stdout


def test_nvidia_1x_csv_passes_check_under_its_own_names():
    p = check("-f", str(FIXTURES / "nvidia-4.8.2" / "1.x-compatibility-metrics.csv"))
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout.startswith("ok: 20 metrics, 0 label fields: dcgm_sm_clock, dcgm_memory_clock")


def test_check_with_a_problem_does_not_say_ok(tmp_path):
    p = check("-k", "--pod-resources-kubelet-socket", str(tmp_path / "kubelet.sock"))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "kubelet.sock" in p.stderr and "error:" in p.stderr
    assert not p.stdout.startswith("ok") and p.stdout.startswith("not ok (the errors above): ")


def test_help_names_the_node_label_and_both_device_kinds():
    text = " ".join(run("--help").stdout.split())
    assert "-n [BOOL], --no-hostname [BOOL] leave out the node label (hostname, or Hostname" in text
    assert "or both g[:IDS]+i[:IDS]" in text
