"""GPU health status (DCGM_EXP_GPU_HEALTH_STATUS data) from NVML's reports."""

from __future__ import annotations

import time

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.derive.health import (
    FAIL,
    PASS,
    WARN,
    WATCHES,
    HealthInputs,
    HealthTracker,
    gpu_health,
    grade,
)
from exporter.sim.clock import ManualClock
from exporter.sim.faults import Fault
from tests.support import dcgmtable


def as_dict(series):
    return {s.watch: (s.value, s.error_code) for s in series}


def test_healthy_gpu_has_one_passing_series_per_watch():
    series = gpu_health(HealthInputs(dbe_volatile=0, row_remap_pending=0))
    assert [s.watch for s in series] == list(WATCHES)
    # dcgm-exporter 4.8.2 serves its ten subsystem watches and ALL (GPU-wide incidents)
    assert WATCHES[-1] == "ALL" and len(WATCHES) == 11
    assert {(s.value, s.error_code) for s in series} == {(PASS, "DCGM_FR_OK")}


@pytest.mark.parametrize(
    ("inputs", "watch", "value", "code"),
    [
        (HealthInputs(dbe_volatile=2), "MEM", FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"),
        (HealthInputs(row_remap_failure=1), "MEM", FAIL, "DCGM_FR_ROW_REMAP_FAILURE"),
        (HealthInputs(row_remap_pending=1), "MEM", WARN, "DCGM_FR_PENDING_ROW_REMAP"),
        (HealthInputs(retired_pending=3), "MEM", WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"),
        (
            HealthInputs(thermal_violation_ns=5e8),
            "THERMAL",
            WARN,
            "DCGM_FR_CLOCK_THROTTLE_THERMAL",
        ),
        (HealthInputs(power_violation_ns=1.0), "POWER", WARN, "DCGM_FR_CLOCK_THROTTLE_POWER"),
        (HealthInputs(lost=True), "DRIVER", FAIL, "DCGM_FR_NVML_API"),
        (HealthInputs({79: 1}), "ALL", FAIL, "DCGM_FR_FALLEN_OFF_BUS"),
        (HealthInputs({74: 4}), "ALL", FAIL, "DCGM_FR_XID_ERROR"),
        (HealthInputs({95: 1}), "ALL", FAIL, "DCGM_FR_UNCONTAINED_ERROR"),
        (HealthInputs({94: 1}), "ALL", WARN, "DCGM_FR_CONTAINED_ERROR"),
        (HealthInputs({119: 1}), "ALL", FAIL, "DCGM_FR_XID_ERROR"),
        (HealthInputs({61: 1}), "THERMAL", WARN, "DCGM_FR_XID_ERROR"),
        (HealthInputs({93: 1}, volta=True), "INFOROM", WARN, "DCGM_FR_CORRUPT_INFOROM"),
    ],
)
def test_incident_sets_its_watch_only(inputs, watch, value, code):
    got = as_dict(gpu_health(inputs))
    assert got[watch] == (value, code)
    assert all(v == (PASS, "DCGM_FR_OK") for w, v in got.items() if w != watch)


def test_xids_dcgm_ignores_leave_health_alone():
    """Application XIDs, and 93 on a GPU that is not Volta (DCGM 4.6 only; 4.5.3 grades it)."""
    got = as_dict(gpu_health(HealthInputs({13: 5, 45: 1, 93: 1, 109: 1, 143: 1})))
    assert {v for v, _ in got.values()} == {PASS}
    got = as_dict(gpu_health(HealthInputs({93: 1}), "4.5.3"))
    assert got["INFOROM"] == (WARN, "DCGM_FR_CORRUPT_INFOROM")


def test_worst_incident_of_a_watch_wins():
    got = as_dict(gpu_health(HealthInputs({63: 1}, row_remap_pending=1, dbe_volatile=1)))
    assert got["MEM"] == (FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")


@pytest.fixture
def node():
    clock = ManualClock()
    driver = sim.install(None, clock=clock)
    col = Collector(load(default_metrics_file()), "n", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    try:
        yield driver, col, clock
    finally:
        col.close()
        sim.uninstall()


def test_health_from_the_simulated_node(node):
    driver, col, clock = node
    tracker = HealthTracker()
    snap = col.collect()
    health = tracker.update(snap)
    assert len(health) == len(snap.gpus)
    for series in health.values():
        assert {s.value for s in series} == {PASS} and len(series) == len(WATCHES)
    driver.inject(Fault("ecc_dbe", gpu=0, count=1))
    driver.inject(Fault("xid", gpu=1, xid=74, count=1))
    driver.inject(Fault("overheat", gpu=2, temp_c=120.0, duration=1000.0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not col.xid.state().counts:
        time.sleep(0.05)
    clock.advance(10.0)
    col.collect()
    clock.advance(10.0)
    driver.inject(Fault("lost", gpu=4))
    snap = col.collect()
    by_key = tracker.update(snap)
    health = {g.index: as_dict(by_key[g.key]) for g in snap.gpus + snap.down}
    assert health[0]["MEM"] == (FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")
    watch, result, code, _ = dcgmtable.table("v4.6.0")[74]  # DCGM's, not the exporter's
    assert health[1][watch] == (result, code)
    assert health[2]["THERMAL"] == (WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL")
    assert health[4]["DRIVER"] == (FAIL, "DCGM_FR_NVML_API")
    assert {v for v, _ in health[3].values()} == {PASS}


def test_grades_follow_dcgm_4_6s_table():
    """NVML-REVIEW N3/N4: XID 79's code is graded (dcgm_errors.c:144), and row-remap
    failure is RESET since DCGM 4.6 (dcgm_errors.c:104 at 72fa3fe; ISOLATE at d646460)."""
    assert grade("DCGM_FR_FALLEN_OFF_BUS") == ("ISOLATE", "HARDWARE_OTHER")
    assert grade("DCGM_FR_ROW_REMAP_FAILURE") == ("RESET", "HARDWARE_MEMORY")


def test_an_xid_incident_lasts_the_exporters_life(node):
    """NVML-REVIEW N2: DCGM keeps an XID in the GPU's history and never erases it
    (DcgmHealthWatch.cpp ProcessXidFv inserts, nothing erases), so its FAIL outlives the
    -x window (300 s) and later healthy cycles, until the exporter restarts."""
    driver, col, clock = node
    tracker = HealthTracker()
    tracker.update(col.collect())
    driver.inject(Fault("xid", gpu=1, xid=48, count=1))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not col.xid.state().counts:
        time.sleep(0.05)
    for _ in range(5):
        clock.advance(120.0)
        snap = col.collect()
        health = {
            g.index: as_dict(s)
            for g in snap.gpus
            for k, s in tracker.update(snap).items()
            if k == g.key
        }
        assert health[1]["ALL"] == (FAIL, "DCGM_FR_XID_ERROR")
