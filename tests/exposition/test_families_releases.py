"""What dcgm-exporter 4.8.3 and 4.8.4 added to its own families, on the simulated node:
DCGM_EXP_CLOCK_EVENTS_TOTAL (edge counts) and the health status's severity and category."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.releases import RELEASES
from exporter.sim import Fault, ManualClock
from tests.support.catalogs import ALL_ROWS_TEXT
from tests.support.exposition import Stages, find

TOTAL = "DCGM_EXP_CLOCK_EVENTS_TOTAL"
HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"


def _node(tmp_path: Path, release: str):
    """(driver, cycle, close) with every row with series, health and clock-event totals
    among them (tests/catalogs.py)."""
    path = tmp_path / "metrics.csv"
    path.write_text(ALL_ROWS_TEXT)
    clock = ManualClock()
    driver = sim.install(None, clock=clock)
    col = Collector(load(path), "node-a", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    builder = Stages(SimpleNamespace(release=RELEASES[release]))
    catalog = load(path)

    def cycle(advance: float = 10.0) -> str:
        clock.advance(advance)
        builder.publish(col.collect(), catalog)
        return builder.text

    def close() -> None:
        col.close()
        sim.uninstall()

    return driver, cycle, close


@pytest.fixture
def node(tmp_path):
    driver, cycle, close = _node(tmp_path, "4.8.4")
    yield driver, cycle
    close()


def _thermal(text: str, gpu: str) -> int | None:
    got = {s.labels["clock_event"]: s.value for s in find(text, TOTAL, gpu=gpu)}
    return got.get("sw_thermal")


def test_clock_events_are_counted_when_a_reason_newly_appears(node):
    driver, cycle = node
    assert _thermal(cycle(), "3") is None  # the first sample primes: no series yet
    driver.inject(Fault("overheat", gpu=3, temp_c=120.0, duration=25.0))
    assert _thermal(cycle(), "3") == 1  # the reason appeared: one event
    assert _thermal(cycle(), "3") == 1  # still set: the same event
    for _ in range(3):
        text = cycle()
    assert _thermal(text, "3") == 1  # gone again
    driver.inject(Fault("overheat", gpu=3, temp_c=120.0, duration=5.0))
    text = cycle(1.0)
    assert _thermal(text, "3") == 2  # a second appearance
    assert _thermal(text, "0") is None  # a cool GPU never had it
    assert {s.labels["clock_event"] for s in find(text, TOTAL, gpu="3")} >= {
        "sw_thermal",
        "hw_thermal",
    }


def test_a_reason_set_at_the_first_sample_is_not_counted(tmp_path):
    driver, cycle, close = _node(tmp_path, "4.8.4")
    try:
        driver.inject(Fault("overheat", gpu=2, temp_c=120.0, duration=1000.0))
        first = cycle()
        later = cycle()
    finally:
        close()
    assert _thermal(first, "2") is None and _thermal(later, "2") is None


def test_health_carries_severity_and_category_from_4_8_4(node):
    driver, cycle = node
    passing = find(cycle(), HEALTH, gpu="0")
    assert {
        (s.labels["health_error_severity"], s.labels["health_error_category"]) for s in passing
    } == {("NONE", "NONE")}
    driver.inject(Fault("ecc_dbe", gpu=0, count=1))
    mem = find(cycle(), HEALTH, gpu="0", health_watch="MEM")
    got = [
        (s.value, s.labels["health_error_severity"], s.labels["health_error_category"]) for s in mem
    ]
    assert got == [(20, "ISOLATE", "HARDWARE_MEMORY")]  # DCGM's table for a volatile DBE
    assert list(mem[0].labels)[-4:] == [
        "health_watch",
        "health_error_code",
        "health_error_severity",
        "health_error_category",
    ]


def test_health_has_no_severity_or_category_under_4_8_2(tmp_path):
    _driver, cycle, close = _node(tmp_path, "4.8.2")
    try:
        series = find(cycle(), HEALTH, gpu="0")
    finally:
        close()
    assert series and not [s for s in series if "health_error_severity" in s.labels]
