"""python3 -m tools.devicecheck on the simulator, as CI runs it: green on a faithful
driver, red with a table on a skewed one, a partial report when cut short, and the
field-support matrix of docs/compatibility.md current."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import ROOT, wait_until
from tools.devicecheck.compare import CHECKS
from tools.devicecheck.probes import PROBES

GB200 = "exporter/sim/fleets/gb200.yaml"
QUICK = ("--cycles", "2", "--interval", "0.3", "--calls", "20")


def device(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.devicecheck", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def green(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("device")
    p = device("--simulate", GB200, "--out", str(out), *QUICK, "--process-seconds", "3")
    return p, {
        "json": json.loads((out / "report.json").read_text()),
        "md": (out / "report.md").read_text(),
    }


def test_the_simulator_agrees_with_its_stand_in(green):
    p, got = green
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    res = got["json"]
    assert res["complete"] and res["simulated"] and not res.get("error")
    assert "# Device check: PASS" in got["md"]
    compared = {r["field"] for r in res["rows"] if r["verdict"] == "ok"}
    assert {c.field for c in CHECKS} - compared <= {
        # what a GB200 tray has not: an encoder, a fan, pre-Ampere page retirement
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_FAN_SPEED",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
    }
    assert any(
        r["field"].startswith("DCGM_FI_DEV_TOTAL_ENERGY") and r["verdict"] == "ok"
        for r in res["rows"]
    )


def test_the_report_has_every_part_the_check_promises(green):
    _, got = green
    res = got["json"]
    assert res["matrix"]["NVIDIA GB200"]["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == "yes"
    assert res["matrix"]["NVIDIA GB200"]["DCGM_FI_DEV_FAN_SPEED"] == "no (NOT_SUPPORTED)"
    field_values = res["costs"]["nvmlDeviceGetFieldValues"]
    assert field_values["calls"] >= 20 and field_values["median_us"] > 0
    assert "latency:\n  enabled: true" in res["latency_yaml"]
    assert [p["item"] for p in res["probes"]] == [name for name, _ in PROBES]
    assert not [p for p in res["probes"] if p["answer"].startswith("probe failed")]
    (run,) = res["process"]
    assert run["driver"] == "simulated" and run["cycles"] >= 1
    assert run["cpu_ms_per_cycle"] > 0 and run["rss_mib"] > 0
    for heading in (
        "## Every compared field",
        "## Field support",
        "## NVML call costs",
        "## The exporter collecting every second",
        "## NVML review probes",
    ):
        assert heading in got["md"], heading


def test_a_skewed_field_fails_with_a_table(tmp_path: Path):
    skew = {"GPU_EXPORTER_DEVICE_SKEW": "temperature_c:+7"}
    p = device("--simulate", GB200, "--out", str(tmp_path), *QUICK, "--no-process", env=skew)
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads((tmp_path / "report.json").read_text())
    bad = {r["field"] for r in res["rows"] if r["verdict"] != "ok" and r["verdict"] != "n/a"}
    assert bad == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"}
    header = next(line for line in p.stdout.splitlines() if line.startswith("cycle"))
    heads = "cycle GPU field nvidia-smi before exporter after tolerance verdict"
    assert header.split() == heads.split()
    assert "DCGM_FI_DEV_GPU_TEMP" in p.stdout and "MISMATCH" in p.stdout
    assert "## Mismatches" in (tmp_path / "report.md").read_text()


def test_a_run_cut_short_leaves_its_report(tmp_path: Path):
    argv = [sys.executable, "-m", "tools.devicecheck", "--simulate", GB200]
    argv += ["--out", str(tmp_path), "--cycles", "1000", "--interval", "0.2", "--no-process"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:

        def comparing() -> bool:
            path = tmp_path / "report.json"
            return path.exists() and json.loads(path.read_text())["phase"] == "compare"

        wait_until(comparing, 60, "the compare phase")
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    res = json.loads((tmp_path / "report.json").read_text())
    assert not res["complete"] and res["rows"]
    assert "INCOMPLETE (compare)" in (tmp_path / "report.md").read_text()


def test_real_mode_without_a_driver_says_so(tmp_path: Path):
    p = device("--real", "--out", str(tmp_path))
    assert p.returncode == 2
    assert "no NVIDIA driver here" in p.stderr


def test_the_compatibility_matrix_is_current():
    p = device("--matrix-doc", "--check")
    assert p.returncode == 0, p.stderr
