"""End to end: the exporter as a subprocess on a simulated node, scraped over HTTP."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.procs import ROOT, Exporter, require, wait_until
from tests.support.exposition import find, masked

FLEETS = ROOT / "tests" / "fixtures" / "fleets"
GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# NVIDIA's default CSV (4.8.2) types these throughputs `counter`.
RATES_TYPED_COUNTER = (
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
)

# The only promtool lint findings allowed: DCGM's names and labels, kept for compatibility.
ALLOWED_LINT = (
    "metric names should be written in 'snake_case' not 'camelCase'",
    'counter metrics should have "_total" suffix',
    "label names should be written in 'snake_case' not 'camelCase'",
    'non-histogram and non-summary metrics should not have "_count" suffix',
    'non-counter metrics should not have "_total" suffix',
    "metric name should not include type 'counter'",  # DCGM_FI_DEV_PCIE_REPLAY_COUNTER
    "metric name should not include type 'summary'",  # DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY
)


@pytest.fixture(scope="module")
def default_node():
    exp = Exporter("-c", "300")
    try:
        exp.wait_ready()
        wait_until(lambda: "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in exp.metrics(), 10, "GPM values")
        yield exp
    finally:
        exp.stop()


@pytest.fixture(scope="module")
def mixed_node():
    exp = Exporter("-c", "300", fleet=FLEETS / "mixed.yaml")
    try:
        exp.wait_ready()
        wait_until(lambda: "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in exp.metrics(), 10, "GPM values")
        yield exp
    finally:
        exp.stop()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.prom"
    got = masked(text)
    if UPDATE:
        path.write_text(got)
    if not path.exists():
        pytest.fail(f"golden file {path} is missing: UPDATE_GOLDEN=1 writes it")
    assert got == path.read_text(), f"differs from {path}; UPDATE_GOLDEN=1 rewrites it"


def test_default_node_golden(default_node):
    check_golden("default-node", default_node.metrics())


def test_mixed_node_golden(mixed_node):
    check_golden("mixed-node", mixed_node.metrics())


def test_default_node_has_8_h100s_and_mig_instances(default_node):
    text = default_node.metrics()
    temps = find(text, "DCGM_FI_DEV_GPU_TEMP")
    assert sorted({int(s.labels["gpu"]) for s in temps}) == list(range(8))
    assert len(temps) == 6 + 11  # whole GPUs once, MIG GPUs once per GPU instance (-d f)
    assert {s.labels["modelName"] for s in temps} == {"NVIDIA H100 80GB HBM3"}
    assert all(s.labels["hostname"] == "sim-node" for s in temps)  # 4.8.4's label
    assert [k for k in temps[0].labels][:6] == [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "hostname",
    ]
    util_gpus = {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_GPU_UTIL")}
    assert util_gpus == {"0", "1", "2", "3", "4", "5"}  # GPUs 6 and 7 are in MIG mode
    fb = find(text, "DCGM_FI_DEV_FB_USED")
    whole = [s for s in fb if "GPU_I_ID" not in s.labels]
    mig = [s for s in fb if "GPU_I_ID" in s.labels]
    assert sorted(s.labels["gpu"] for s in whole) == ["0", "1", "2", "3", "4", "5"]
    assert len(mig) == 11
    assert sorted(s.labels["GPU_I_PROFILE"] for s in mig if s.labels["gpu"] == "7") == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    gpm = find(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="6")
    mig_gpm = {s.labels.get("GPU_I_ID") for s in gpm}
    assert len(mig_gpm) == 7 and None not in mig_gpm


def test_device_level_series_repeat_per_mig_instance(mixed_node):
    """As dcgm-exporter's default -d f: on a MIG GPU, one series per GPU instance, all
    with the parent's value, and no parent series; whole GPUs keep one series."""
    text = mixed_node.metrics()
    instances = {
        (s.labels["gpu"], s.labels["GPU_I_ID"])
        for s in find(text, "DCGM_FI_DEV_FB_USED")
        if "GPU_I_ID" in s.labels
    }
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"):
        series = find(text, name)
        mig = [s for s in series if s.labels["gpu"] in ("1", "2")]
        assert {(s.labels["gpu"], s.labels.get("GPU_I_ID")) for s in mig} == instances, name
        for gpu in ("1", "2"):
            assert len({s.value for s in mig if s.labels["gpu"] == gpu}) == 1, name
        whole = [s for s in series if s.labels["gpu"] not in ("1", "2")]
        assert whole and not [s for s in whole if "GPU_I_ID" in s.labels]


def test_sum_of_framebuffer_counts_each_gpu_once(mixed_node):
    text = mixed_node.metrics()
    framebuffer = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    total = sum(s.value for name in framebuffer for s in find(text, name))
    # H100 81559 + MIG H100 (40448+20096+9984 -> 39+19+9 GiB-ish instance sizes) etc.: the
    # sum must not include the MIG parents' own totals.
    parents = {"1", "2"}
    assert not [
        s
        for s in find(text, "DCGM_FI_DEV_FB_USED")
        if s.labels["gpu"] in parents and "GPU_I_ID" not in s.labels
    ]
    assert total < 81559 * 2 + 40960 + 23034 + 15360


def test_unsupported_fields_are_absent_not_zero(mixed_node):
    text = mixed_node.metrics()
    models = {s.labels["gpu"]: s.labels["modelName"] for s in find(text, "DCGM_FI_DEV_GPU_TEMP")}
    prof_gpus = {s.labels["gpu"] for s in find(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    assert prof_gpus == {g for g, m in models.items() if "H100" in m}
    remap = {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_ROW_REMAP_PENDING")}
    assert models[next(iter(set(models) - remap))] == "Tesla T4"  # T4 has no row remapping
    retired = {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_RETIRED_PENDING")}
    assert [models[g] for g in retired] == ["Tesla T4"]
    assert "NaN" not in text


def test_xid_gauge_starts_at_no_error(mixed_node):
    for s in find(mixed_node.metrics(), "DCGM_FI_DEV_XID_ERRORS"):
        assert s.value == 0 and s.labels["err_code"] == "0" and s.labels["err_msg"] == "No Error"


def test_gzip_is_the_same_exposition(default_node):
    status, headers, body = default_node.get("/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = gzip.decompress(body).decode()
    assert "DCGM_FI_DEV_GPU_TEMP{" in text


def test_endpoints(default_node):
    status, _headers, body = default_node.get("/")
    assert status == 200 and b'href="metrics"' in body
    assert default_node.get("/health")[0] == 200
    status, _, body = default_node.get("/ready")
    assert status == 200 and body.startswith(b"ready")
    assert default_node.get("/nope")[0] == 404


def test_promtool_accepts_all_but_dcgm_naming(default_node):
    promtool = require("promtool", "prometheus")
    p = subprocess.run(
        [promtool, "check", "metrics"],
        input=default_node.metrics(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    problems = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    unexpected = [line for line in problems if not any(a in line for a in ALLOWED_LINT)]
    assert unexpected == []
    # the exceptions are only on DCGM's own names: our families pass every lint rule
    for line in problems:
        assert line.startswith("DCGM_"), line


def test_promtool_finds_nothing_in_our_own_families(default_node):
    """promtool check metrics on a default scrape, given only the gpu_exporter_* and
    process_* families (so that its exit status speaks for them alone): no finding."""
    promtool = require("promtool", "prometheus")
    ours = "".join(
        line + "\n"
        for line in default_node.metrics().splitlines()
        if re.match(r"(# (HELP|TYPE) )?(gpu_exporter_|process_)", line)
    )
    assert "gpu_exporter_gpu_up{" in ours and "process_cpu_seconds_total " in ours
    p = subprocess.run(
        [promtool, "check", "metrics"], input=ours, capture_output=True, text=True, timeout=30
    )
    assert (p.returncode, p.stdout + p.stderr) == (0, "")


def test_dcgm_default_counters_file_runs(tmp_path: Path):
    csv = ROOT / "tests" / "fixtures" / "csv" / "dcgm-default-counters.csv"
    exp = Exporter("-c", "300", "-f", str(csv))
    try:
        exp.wait_ready()
        text = exp.metrics()
        assert find(text, "DCGM_FI_DEV_DEC_UTIL")
        assert not find(text, "DCGM_FI_DEV_VGPU_LICENSE_STATUS")
        skipped = find(text, "gpu_exporter_metrics_file_skipped_row")
        # the info pattern: value 1, the row's line number in a label
        rows = enumerate(csv.read_text().splitlines(), 1)
        line = next(i for i, row in rows if row.startswith("DCGM_FI_DEV_VGPU_LICENSE_STATUS"))
        assert [(s.labels, s.value) for s in skipped] == [
            ({"field": "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "line": str(line)}, 1)
        ]
        assert all("DCGM_FI_DRIVER_VERSION" in s.labels for s in find(text, "DCGM_FI_DEV_GPU_TEMP"))
    finally:
        log = exp.stop()
    assert "1 row of" in log and "not served" in log and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in log
    # NVIDIA's file types three throughputs `counter`: served so, and said once
    for name in RATES_TYPED_COUNTER:
        assert f"# TYPE {name} counter" in text
    said = [ln for ln in log.splitlines() if "rate() or increase() over it is wrong" in ln]
    assert len(said) == 1 and all(name in said[0] for name in RATES_TYPED_COUNTER), log


@pytest.mark.parametrize(
    ("flag", "want"),
    [
        ("g", {(str(i), None) for i in range(8)}),
        ("g:0,7", {("0", None), ("7", None)}),
        ("i:7", {("6", "7"), ("7", "7")}),
        ("g:0,6+i:7", {("0", None), ("6", None), ("6", "7"), ("7", "7")}),
    ],
)
def test_devices_flag_picks_the_series_devices(flag: str, want: set):
    exp = Exporter("-c", "300", "-d", flag)
    try:
        exp.wait_ready()
        text = exp.metrics()
    finally:
        exp.stop()
    power = find(text, "DCGM_FI_DEV_POWER_USAGE")
    assert {(s.labels["gpu"], s.labels.get("GPU_I_ID")) for s in power} == want
    assert len(power) == len(want)
