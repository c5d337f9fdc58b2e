"""The collector through real pynvml against the simulated driver, one cycle at a time."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from benchmarks.accounting import instrument
from exporter import sim
from exporter.catalog.metricsfile import load, parse
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.sim.clock import ManualClock
from exporter.sim.faults import Fault
from tests.support.catalogs import ALL_ROWS
from tests.support.exposition import Stages

ROOT = Path(__file__).parents[1]
FIXTURES_FLEETS = ROOT / "tests" / "fixtures" / "fleets"
MIXED = FIXTURES_FLEETS / "mixed.yaml"


def render(snap, catalog):
    """The DCGM part of the exposition built from one snapshot, and its series count."""
    b = Stages()
    n = b.publish(snap, catalog)
    return b.text, n


CATALOG = ALL_ROWS  # every family with series: some tests read rows the default leaves out


@pytest.fixture
def node(request):
    """(driver, collector, clock) on the fleet named by the test's parameter (default fleet)."""
    fleet = getattr(request, "param", None)
    clock = ManualClock()
    driver = sim.install(fleet, clock=clock)
    col = Collector(CATALOG, "node-a", slow_s=5.0, clock=lambda: 1_700_000_000 + clock())
    try:
        yield driver, col, clock
    finally:
        col.close()
        sim.uninstall()


def cycle(col, clock, step=1.0):
    snap = col.collect()
    clock.advance(step)
    return snap


def by_gpu(snap, name):
    return {d.index: snap.values[d.key][name] for d in snap.gpus if name in snap.values[d.key]}


@pytest.mark.parametrize("node", [MIXED], indirect=True)
def test_values_in_dcgm_units(node):
    _driver, col, clock = node
    cycle(col, clock)
    snap = cycle(col, clock)
    assert snap.ok
    models = {d.index: d.model for d in snap.gpus}
    assert models == {
        0: "NVIDIA H100 80GB HBM3",
        1: "NVIDIA H100 80GB HBM3",
        2: "NVIDIA A100-SXM4-40GB",
        3: "NVIDIA L4",
        4: "Tesla T4",
    }
    assert by_gpu(snap, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == {0: 700, 1: 700, 2: 400, 3: 72, 4: 70}
    whole = {d.index: snap.values[d.key] for d in snap.entities if not d.is_mig}
    assert whole[0]["DCGM_FI_DEV_FB_TOTAL"] == 81559
    assert whole[3]["DCGM_FI_DEV_FB_TOTAL"] == 23034
    # processes on GPU 0 hold 30 GiB: used framebuffer is at least that, in MiB
    assert whole[0]["DCGM_FI_DEV_FB_USED"] >= 30720
    for v in by_gpu(snap, "DCGM_FI_DEV_POWER_USAGE").values():
        assert isinstance(v, float) and 0 < v <= 700
    assert set(by_gpu(snap, "DCGM_FI_DEV_GPU_UTIL")) == {0, 3, 4}  # 1 and 2 are in MIG mode
    mig = sorted((d.index, d.profile, d.gi) for d in snap.entities if d.is_mig)
    assert [(i, p) for i, p, _ in mig] == [
        (1, "1g.10gb"),
        (1, "2g.20gb"),
        (1, "3g.40gb"),
        (2, "1g.5gb"),
        (2, "3g.20gb"),
    ]
    h100_mig = [d for d in snap.entities if d.is_mig and d.index == 1]
    assert all(0 <= snap.values[d.key]["DCGM_FI_PROF_SM_ACTIVE"] <= 1 for d in h100_mig)
    a100_mig = [d for d in snap.entities if d.is_mig and d.index == 2]
    assert not any("DCGM_FI_PROF_SM_ACTIVE" in snap.values[d.key] for d in a100_mig)


def test_counters_are_monotonic(node):
    _, col, clock = node
    a = cycle(col, clock, 5.0)
    b = cycle(col, clock, 5.0)
    ea = by_gpu(a, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    eb = by_gpu(b, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert ea and all(eb[i] > ea[i] for i in ea)


def test_unsupported_is_omitted_and_logged_once(node, caplog):
    driver, col, clock = node
    caplog.set_level(logging.DEBUG)
    driver.inject(Fault("not_supported", gpu=3, function="nvmlDeviceGetPowerUsage"))
    for _ in range(3):
        snap = cycle(col, clock)
    assert 3 not in by_gpu(snap, "DCGM_FI_DEV_POWER_USAGE")
    assert 4 in by_gpu(snap, "DCGM_FI_DEV_POWER_USAGE")
    lines = [r for r in caplog.records if "DCGM_FI_DEV_POWER_USAGE not available" in r.getMessage()]
    assert len(lines) == 1 and "GPU 3" in lines[0].getMessage()
    assert lines[0].levelno == logging.DEBUG
    # one INFO summary for all unsupported fields of all GPUs, not one line per field per GPU
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    summary = [m for m in info if "not available on at least one GPU" in m]
    assert len(summary) == 1
    assert "DCGM_FI_DEV_POWER_USAGE" in summary[0]  # named in full, as the CSV names it
    assert not [m for m in info if " not available on GPU" in m]
    errors = {(f, c): n for f, c, n in col.session.error_counts()}
    assert errors[("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED")] == 1  # never asked again


def test_lost_gpu_does_not_stop_the_others(node):
    driver, col, clock = node
    cycle(col, clock)
    driver.inject(Fault("lost", gpu=2))
    snap = cycle(col, clock)
    assert sorted(d.index for d in snap.gpus) == [0, 1, 3, 4, 5, 6, 7]
    assert [d.index for d in snap.down] == [2]
    assert any("GPU 2" in p and "lost" in p for p in snap.problems)
    assert len(by_gpu(snap, "DCGM_FI_DEV_GPU_TEMP")) == 7
    text, _ = render(snap, load(default_metrics_file()))  # no health rows: a lost GPU has one
    assert 'gpu="2"' not in text


def test_mig_reconfigured_at_run_time(node):
    driver, col, clock = node
    snap = cycle(col, clock)
    before = sorted(d.profile for d in snap.entities if d.is_mig and d.index == 6)
    assert before == ["1g.10gb"] * 7
    driver.inject(Fault("mig_reconfigure", gpu=6, mig=[{"profile": "7g.80gb"}]))
    snap = cycle(col, clock)
    after = [d for d in snap.entities if d.is_mig and d.index == 6]
    assert [d.profile for d in after] == ["7g.80gb"]
    assert snap.values[after[0].key]["DCGM_FI_DEV_FB_TOTAL"] > 70000
    assert snap.ok


def test_the_driver_cannot_unload_under_the_collector_until_it_closes(node):
    """The exporter holds NVML, so rmmod is refused ("in use"): collection goes on; the
    module goes when the exporter is stopped (evicted for an upgrade)."""
    driver, col, clock = node
    cycle(col, clock)
    driver.inject(Fault("driver_unloaded", duration=3.0))
    snap = cycle(col, clock)
    assert snap.ok and len(snap.gpus) == 8
    assert driver.module.refused_unloads == 1 and driver.module.loaded is not None
    col.close()
    assert driver.module.loaded is None


def test_xid_storm_counts_exactly(node):
    driver, col, clock = node
    cycle(col, clock)
    driver.inject(Fault("xid", gpu=0, xid=13, count=1000))
    driver.inject(Fault("xid", gpu=6, xid=31, gi=next(iter_gis(col, 6)), count=5))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        counts = {(u, gi, x): n for u, gi, _ci, x, n in col.xid.state().counts}
        if sum(counts.values()) == 1005:
            break
        time.sleep(0.05)
    snap = cycle(col, clock)
    counts = {(gi, x): n for _, gi, _ci, x, n in snap.xid.counts}
    assert counts[(None, 13)] == 1000
    assert sum(n for (gi, x), n in counts.items() if x == 31 and gi is not None) == 5
    # a MIG XID names its compute instance too (the simulator fills computeInstanceId)
    assert {ci is not None for _, gi, ci, _x, _n in snap.xid.counts} == {True, False}
    assert all((ci is None) == (gi is None) for _, gi, ci, _x, _n in snap.xid.counts)
    text, _ = render(snap, CATALOG)
    assert 'DCGM_FI_DEV_XID_ERRORS{gpu="0"' in text and 'err_code="13"' in text
    total = "DCGM_EXP_XID_ERRORS_TOTAL{"
    mig_line = [ln for ln in text.splitlines() if 'xid="31"' in ln and ln.startswith(total)]
    assert len(mig_line) == 1 and "GPU_I_ID" in mig_line[0]


def test_xid_log_lines_are_bounded_in_all_not_only_per_code(node, caplog):
    """Forty XID codes on four GPUs at once (a tenant can raise some on every MIG
    instance): every event counted, and 10 XID lines logged, the minute's bound that
    docs/reliability.md states, not 40."""
    driver, col, clock = node
    cycle(col, clock)
    codes = range(1, 41)
    with caplog.at_level(logging.WARNING, logger="exporter.nvml.xid.events"):
        for i, xid in enumerate(codes):
            driver.inject(Fault("xid", gpu=i % 4, xid=xid, count=2))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sum(n for *_, n in col.xid.state().counts) == 2 * len(codes):
                break
            time.sleep(0.05)
    assert sum(n for *_, n in col.xid.state().counts) == 2 * len(codes)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("XID ")]
    assert len(lines) == 10, lines


def iter_gis(col, index):
    snap = col.collect()
    return (d.gi for d in snap.entities if d.is_mig and d.index == index)


def test_gpm_prof_fields_in_the_first_snapshot(node):
    _driver, col, clock = node
    col.gpm.sleep = clock.advance  # the priming wait moves sim time
    snap = col.collect()
    h100 = [d for d in snap.entities if d.model.startswith("NVIDIA H100")]
    assert h100
    for d in h100:
        assert 0 <= snap.values[d.key]["DCGM_FI_PROF_SM_ACTIVE"] <= 1
    errors = {f for f, _c, _n in col.session.error_counts()}
    assert not {f for f in errors if f.startswith("nvmlGpm")}


def test_gpm_prof_fields_right_after_a_mig_change(node):
    driver, col, clock = node
    col.gpm.sleep = clock.advance
    cycle(col, clock, 30.0)
    driver.inject(Fault("mig_reconfigure", gpu=6, mig=[{"profile": "7g.80gb"}]))
    snap = cycle(col, clock, 30.0)
    after = [d for d in snap.entities if d.is_mig and d.index == 6]
    assert [d.profile for d in after] == ["7g.80gb"]
    assert "DCGM_FI_PROF_SM_ACTIVE" in snap.values[after[0].key]


def test_gpm_metrics_follow_a_metrics_file_reload(node):
    _driver, col, clock = node
    col.gpm.sleep = clock.advance
    cycle(col, clock)
    fewer = parse(
        "DCGM_FI_DEV_GPU_TEMP, gauge, temperature.\n"
        "DCGM_FI_PROF_DRAM_ACTIVE, gauge, memory interface busy.\n"
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE, gauge, fp64 pipe busy.\n"
    )
    col.set_catalog(fewer)
    snap = cycle(col, clock)
    h100 = [d for d in snap.entities if d.model.startswith("NVIDIA H100")]
    assert h100
    for d in h100:
        prof = {n for n in snap.values[d.key] if n.startswith("DCGM_FI_PROF_")}
        assert prof == {"DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE"}


def test_board_limits_read_once_per_device(node):
    driver, col, clock = node
    first = cycle(col, clock)
    calls = instrument(driver).calls
    steady = cycle(col, clock)
    assert calls["nvmlDeviceGetTemperatureThreshold"] == 0
    assert calls["nvmlDeviceGetMaxClockInfo"] == 0
    assert calls["nvmlDeviceGetMaxMigDeviceCount"] == 0
    assert calls["nvmlDeviceGetClockInfo"] > 0  # what moves is still read every cycle
    assert by_gpu(steady, "DCGM_FI_DEV_SLOWDOWN_TEMP") == by_gpu(first, "DCGM_FI_DEV_SLOWDOWN_TEMP")
    assert len(by_gpu(first, "DCGM_FI_DEV_SLOWDOWN_TEMP")) == 8


@pytest.mark.parametrize("node", [FIXTURES_FLEETS / "no-gpus.yaml"], indirect=True)
def test_no_gpu_at_all_is_said_once(node, caplog):
    _, col, clock = node
    with caplog.at_level(logging.WARNING, logger="exporter"):
        for _ in range(3):
            assert cycle(col, clock).gpus == ()
    said = [r.getMessage() for r in caplog.records if "NVML sees 0 GPUs" in r.getMessage()]
    assert len(said) == 1 and "NVIDIA_VISIBLE_DEVICES" in said[0]


def test_gpus_present_say_nothing_of_none(node, caplog):
    _, col, clock = node
    with caplog.at_level(logging.WARNING, logger="exporter"):
        cycle(col, clock)
    assert not [r for r in caplog.records if "0 GPUs" in r.getMessage()]
