"""dcgm-exporter's own families on the simulated node, with its labels: windowed XID and
clock-event counts, GPU health status and P2P status, per GPU and per MIG instance."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.exposition import dcgm
from exporter.nvml.fields import Source
from exporter.sim import Fault, ManualClock
from tests.support.catalogs import ALL_ROWS_TEXT
from tests.support.exposition import Stages, find

XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
CLOCK = "DCGM_EXP_CLOCK_EVENTS_COUNT"
HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"
P2P = "DCGM_EXP_P2P_STATUS"
MIXED = Path(__file__).parents[1] / "fixtures" / "fleets" / "mixed.yaml"


def all_families(tmp_path: Path) -> Path:
    """Every row with series of its own, health and P2P included (tests/catalogs.py)."""
    path = tmp_path / "all.csv"
    path.write_text(ALL_ROWS_TEXT)
    return path


def make_node(tmp_path: Path, fleet: Path | None = None, cfg: object = None):
    clock = ManualClock()
    driver = sim.install(fleet, clock=clock)
    col = Collector(load(all_families(tmp_path)), "node-a", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    builder = Stages(cfg)
    catalog = load(all_families(tmp_path))

    def cycle(advance: float = 10.0) -> str:
        clock.advance(advance)
        builder.publish(col.collect(), catalog)
        return builder.text

    return driver, col, cycle


@pytest.fixture
def node(tmp_path):
    driver, col, cycle = make_node(tmp_path)
    try:
        yield driver, col, cycle
    finally:
        col.close()
        sim.uninstall()


def arrive(col: Collector, total: int) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if col.xid is not None and sum(n for *_, n in col.xid.state().counts) >= total:
            return
        time.sleep(0.02)
    raise AssertionError("XIDs did not arrive")


def test_xid_count_per_code_within_the_window(node):
    driver, col, cycle = node
    text = cycle()
    zero = find(text, XID_COUNT, gpu="0")
    assert [(s.value, s.labels["window_size_in_ms"], "xid" in s.labels) for s in zero] == [
        (0, "300000", False)
    ]
    driver.inject(Fault("xid", gpu=0, xid=95, count=3))
    driver.inject(Fault("xid", gpu=0, xid=48, count=1))
    arrive(col, 4)
    text = cycle()
    got = {s.labels.get("xid"): s.value for s in find(text, XID_COUNT, gpu="0")}
    assert got == {"48": 1, "95": 3}
    assert [s.value for s in find(text, XID_COUNT, gpu="1")] == [0]
    text = cycle(400.0)  # older than the 300 s window
    assert [s.labels.get("xid") for s in find(text, XID_COUNT, gpu="0")] == [None]


def test_clock_events_of_a_throttled_gpu(node):
    driver, _col, cycle = node
    driver.inject(Fault("overheat", gpu=3, temp_c=120.0, duration=1000.0))
    for _ in range(3):
        text = cycle()
    got = {s.labels.get("clock_event"): s.value for s in find(text, CLOCK, gpu="3")}
    assert got["sw_thermal"] == got["hw_thermal"] == 3
    assert all(s.labels["window_size_in_ms"] == "300000" for s in find(text, CLOCK))
    assert "sw_thermal" not in {s.labels.get("clock_event") for s in find(text, CLOCK, gpu="0")}


def test_health_fails_on_a_double_bit_ecc_error(node):
    driver, _col, cycle = node
    text = cycle()
    gpu0 = find(text, HEALTH, gpu="0")
    assert len(gpu0) == 11 and {s.value for s in gpu0} == {0}
    assert {s.labels["health_error_code"] for s in gpu0} == {"DCGM_FR_OK"}
    driver.inject(Fault("ecc_dbe", gpu=0, count=1))
    text = cycle()
    mem = find(text, HEALTH, gpu="0", health_watch="MEM")
    assert [(s.value, s.labels["health_error_code"]) for s in mem] == [
        (20, "DCGM_FR_VOLATILE_DBE_DETECTED")
    ]
    assert {s.value for s in find(text, HEALTH, gpu="1")} == {0}


def test_health_of_a_lost_gpu_is_a_driver_failure(node):
    driver, _col, cycle = node
    cycle()
    driver.inject(Fault("lost", gpu=4))
    text = cycle()
    drv = find(text, HEALTH, gpu="4", health_watch="DRIVER")
    assert [(s.value, s.labels["health_error_code"]) for s in drv] == [(20, "DCGM_FR_NVML_API")]


def test_p2p_status_per_gpu_pair(node):
    _driver, _col, cycle = node
    text = cycle()
    peers = find(text, P2P, gpu="0")
    assert sorted(s.labels["peer_gpu"] for s in peers) == [str(i) for i in range(1, 8)]
    assert {(s.labels["link_status"], s.value) for s in peers} == {("OK", 0)}


def test_families_repeat_per_mig_instance_under_the_default_devices(node):
    driver, col, cycle = node
    text = cycle()
    instances = {s.labels["GPU_I_ID"] for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="6")}
    assert len(instances) == 7
    for name in (XID_COUNT, CLOCK, HEALTH, P2P, "DCGM_FI_DEV_POWER_USAGE"):
        series = find(text, name, gpu="6")
        assert {s.labels.get("GPU_I_ID") for s in series} == instances, name
    driver.inject(Fault("xid", gpu=6, xid=74, count=1))
    arrive(col, 1)
    text = cycle()
    all_ = find(text, HEALTH, gpu="6", health_watch="ALL")  # XID 74: DCGM files it under ALL
    assert len(all_) == 7 and {s.value for s in all_} == {20}


def test_gpus_only_and_window_sizes_from_the_config(tmp_path):
    cfg = SimpleNamespace(
        devices=SimpleNamespace(mode="g", ids=None), xid_window_s=60.0, clock_events_window_s=30.0
    )
    _driver, col, cycle = make_node(tmp_path, cfg=cfg)
    try:
        text = cycle()
    finally:
        col.close()
        sim.uninstall()
    assert not [s for s in find(text, "DCGM_FI_DEV_FB_USED") if "GPU_I_ID" in s.labels]
    power = find(text, "DCGM_FI_DEV_POWER_USAGE")
    assert sorted(int(s.labels["gpu"]) for s in power) == list(range(8))
    assert {s.labels["window_size_in_ms"] for s in find(text, XID_COUNT)} == {"60000"}
    assert {s.labels["window_size_in_ms"] for s in find(text, CLOCK)} == {"30000"}


def test_p2p_without_nvlink_is_not_supported(tmp_path):
    _driver, col, cycle = make_node(tmp_path, MIXED)
    try:
        text = cycle()
    finally:
        col.close()
        sim.uninstall()
    statuses = {s.labels["link_status"] for s in find(text, P2P)}
    assert "NotSupported" in statuses
    assert all(s.labels["peer_gpu"] != s.labels["gpu"] for s in find(text, P2P))


def test_own_families_unchanged_since_the_last_cycle_are_not_written_again(node, monkeypatch):
    """Cycles further apart than the 5-minute windows on an idle node: the windows,
    health, clock totals, last XIDs and P2P status equal the last cycle's, so the same
    text is served without writing those families again (their CPU per cycle); only the
    XID counts, which name gone devices, are written every cycle."""
    _, _, cycle = node
    own = (XID_COUNT, CLOCK, HEALTH, "DCGM_EXP_CLOCK_EVENTS_TOTAL")
    cycle(400.0)  # the first cycle's clock window has no sample before it
    first = cycle(400.0)
    written: Counter[str] = Counter()

    def counted(fn):
        return lambda spec, fr: written.update([spec.name]) or fn(spec, fr)

    for name in own:
        monkeypatch.setitem(dcgm.BY_NAME, name, counted(dcgm.BY_NAME[name]))
    for source in (Source.XID, Source.P2P):
        monkeypatch.setitem(dcgm.SPECIAL, source, counted(dcgm.SPECIAL[source]))
    second = cycle(400.0)
    also = ("DCGM_FI_DEV_XID_ERRORS", P2P)
    assert all(find(second, n) for n in (*own[:3], *also))  # no clock event: no totals
    assert [find(second, n) for n in (*own, *also)] == [find(first, n) for n in (*own, *also)]
    assert written == {"DCGM_EXP_XID_ERRORS_TOTAL": 1}
