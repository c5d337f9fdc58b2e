"""Field 449 (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL) is DCGM's rate, not NVML's counter."""

from __future__ import annotations

import pynvml as N
import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.nvml.rates import Sample, counter_rate
from exporter.sim.clock import ManualClock

NAME = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
IDS = [
    (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
    (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
]


def test_rate_is_change_per_second_over_divisor():
    assert counter_rate(Sample(1000.0, 10.0), Sample(21000.0, 20.0), 1000.0) == 2.0


@pytest.mark.parametrize(
    ("prev", "now"),
    [
        (None, Sample(5.0, 1.0)),  # first sample
        (Sample(5.0, 1.0), Sample(9.0, 1.0)),  # time did not move
        (Sample(9.0, 1.0), Sample(5.0, 2.0)),  # counter reset (driver reload)
    ],
)
def test_no_rate_without_two_good_samples(prev, now):
    assert counter_rate(prev, now, 1000.0) is None


@pytest.fixture
def node():
    clock = ManualClock()
    sim.install(None, clock=clock)
    col = Collector(load(default_metrics_file()), "n", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    try:
        yield col, clock
    finally:
        col.close()
        sim.uninstall()


def raw_kib(index: int) -> int:
    """NVML's cumulative NVLink TX+RX KiB of a GPU, as DCGM reads them."""
    values = N.nvmlDeviceGetFieldValues(N.nvmlDeviceGetHandleByIndex(index), IDS)
    assert all(v.nvmlReturn == N.NVML_SUCCESS for v in values)
    return sum(v.value.ullVal for v in values)


def test_field_449_is_the_rate_between_two_samples(node):
    col, clock = node
    first = col.collect()
    linked = [g for g in first.gpus if raw_kib_or_none(g.index) is not None]
    assert linked, "the default fleet has NVLink GPUs"
    # primed: a first sample 100 ms before the cycle's read, so the first cycle has the rate
    assert all(NAME in first.values[g.key] for g in linked)
    before = {g.index: raw_kib(g.index) for g in linked}
    clock.advance(10.0)
    snap = col.collect()
    busy = 0
    for g in linked:
        expected = (raw_kib(g.index) - before[g.index]) / 10.0 / 1000.0
        assert snap.values[g.key][NAME] == int(expected)
        busy += expected >= 1
    assert busy, "some GPU moves data over NVLink"


def raw_kib_or_none(index: int) -> int | None:
    values = N.nvmlDeviceGetFieldValues(N.nvmlDeviceGetHandleByIndex(index), IDS)
    if any(v.nvmlReturn != N.NVML_SUCCESS for v in values):
        return None
    return sum(v.value.ullVal for v in values)


def test_without_priming_wait_the_rate_comes_with_the_second_cycle():
    clock = ManualClock()
    sim.install(None, clock=clock)
    col = Collector(load(default_metrics_file()), "n", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = lambda s: None  # a wait during which the counters did not move on
    try:
        first = col.collect()
        assert not any(NAME in first.values[g.key] for g in first.gpus)
        clock.advance(5.0)
        second = col.collect()
        assert any(NAME in second.values[g.key] for g in second.gpus)
    finally:
        col.close()
        sim.uninstall()
