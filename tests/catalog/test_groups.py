"""Collections of the config file read at their own interval: counted in the simulator's
NVML calls, not inferred from values."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.accounting import instrument
from exporter import sim
from exporter.catalog.groups import GroupError, resolve
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Collection, default_metrics_file
from exporter.poller import Poller
from tests.support.catalogs import ALL_ROWS
from tests.support.exposition import find

CATALOG = load(default_metrics_file())
FAST = Collection("fast-thermals", 0.25, ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"))


@pytest.fixture
def driver():
    d = sim.install(None, latency=False)
    yield d
    sim.uninstall()


async def run(poller: Poller, seconds: float) -> None:
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_faster_collection_reads_its_fields_at_its_own_interval(driver):
    col = Collector(CATALOG, "n", groups=resolve(CATALOG, (FAST,)))
    poller = Poller(CATALOG, col, interval_s=1.0, timeout_s=30.0)  # no load may time it out
    calls = instrument(driver).calls
    try:
        await run(poller, 2.1)  # cycles at 0, 1, 2 s; the group at 0, 0.25, ..., 2 s
        text = poller.builder.dcgm_text
    finally:
        col.close(0.5)
        poller.close()
    gpus = 8
    assert poller.selfmetrics.collections["success"] == 3
    # read by the group only: 9 reads of the 8 GPUs (one more or less on a loaded machine)
    temp = calls["nvmlDeviceGetTemperatureV"] / gpus
    power = calls["nvmlDeviceGetPowerUsage"] / gpus
    assert 8 <= temp <= 10 and power == temp, (temp, power)
    # read by the cycles only: SM, memory and video clocks (and their maxima, read once)
    assert calls["nvmlDeviceGetClockInfo"] == 3 * gpus * 2, calls["nvmlDeviceGetClockInfo"]
    # both served, once per series, with the cycle's labels
    assert len(find(text, "DCGM_FI_DEV_GPU_TEMP")) == len(find(text, "DCGM_FI_DEV_SM_CLOCK")) > 0


async def test_the_first_exposition_has_the_fields_of_every_collection(driver):
    """A collection read every 5 minutes is in the first cycle's exposition, as a field
    DCGM watches is in dcgm-exporter's first scrape; the cycles after leave it to its
    own interval."""
    slow = Collection("slow", 300.0, ("DCGM_FI_DEV_GPU_TEMP",))
    col = Collector(CATALOG, "n", groups=resolve(CATALOG, (slow,)))
    poller = Poller(CATALOG, col, interval_s=1.0, timeout_s=30.0)  # no load may time it out
    calls = instrument(driver).calls
    try:
        await poller.cycle()
        first = poller.builder.dcgm_text
        await poller.cycle()
    finally:
        col.close(0.5)
        poller.close()
    assert len(find(first, "DCGM_FI_DEV_GPU_TEMP")) == len(find(first, "DCGM_FI_DEV_SM_CLOCK")) > 0
    assert calls["nvmlDeviceGetTemperatureV"] == 8  # once per GPU, by the first cycle only


async def test_without_collections_every_field_is_read_each_cycle(driver):
    col = Collector(CATALOG, "n")
    poller = Poller(CATALOG, col, interval_s=0.5, timeout_s=0.4)
    calls = instrument(driver).calls
    try:
        await run(poller, 1.1)
    finally:
        col.close(0.5)
        poller.close()
    assert poller.selfmetrics.collections["success"] == 3
    assert calls["nvmlDeviceGetTemperatureV"] == calls["nvmlDeviceGetPowerUsage"] == 3 * 8


def test_patterns_match_rows_as_written_and_dcgm_names():
    groups = resolve(ALL_ROWS, (Collection("g", 1.0, ("DCGM_FI_DEV_*_TEMP", "DCGM_FI_PROF_*")),))
    names = {f.name for f in groups[0].fields}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_PROF_SM_ACTIVE"} <= names
    with pytest.raises(GroupError, match="also in collection 'a'"):
        resolve(CATALOG, (Collection("a", 1.0, ("DCGM_FI_DEV_GPU_*",)),
                          Collection("b", 2.0, ("DCGM_FI_DEV_GPU_TEMP",))))  # fmt: skip
