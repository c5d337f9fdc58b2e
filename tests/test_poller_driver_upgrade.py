"""A driver upgrade as Linux and the GPU Operator run it: the module cannot unload while
the exporter holds NVML; the exporter is evicted, the driver replaced, the exporter
restarted, and it serves the new driver's version from its first cycle. A library that
does not match the module (or no driver at all) is said in one line and the process
exits, so the kubelet restarts it: pynvml never loads a library twice."""

from __future__ import annotations

import asyncio
import logging

import pytest

from exporter import sim
from exporter.collector import Collector
from exporter.poller import EXIT_NVML, Poller
from exporter.sim import Fault, ManualClock
from tests.support.exposition import find
from tests.support.simnode import CATALOG

OLD, NEW = "580.95.05", "580.105.08"
INTERVAL_S = 0.05


def start() -> Poller:
    return Poller(CATALOG, Collector(CATALOG, "node-a"), interval_s=INTERVAL_S, timeout_s=2.0)


def versions(poller: Poller) -> set[str]:
    text = poller.exposition.plain.decode()
    return {s.labels["DCGM_FI_DRIVER_VERSION"] for s in find(text, "DCGM_FI_DEV_GPU_TEMP")}


def dcgm_series(poller: Poller) -> list[str]:
    text = poller.exposition.plain.decode()
    return [line for line in text.splitlines() if line.startswith("DCGM_")]


@pytest.fixture
def driver():
    clock = ManualClock()
    yield sim.install(None, clock=clock, latency=False)
    sim.uninstall()


async def test_an_upgrade_is_evict_replace_restart_and_serves_the_new_driver(driver):
    poller = start()
    await poller.cycle()
    assert versions(poller) == {OLD}
    driver.inject(Fault("driver_upgrade", version=NEW, duration=20))
    await poller.cycle()  # the module is in use: the upgrade waits, nothing changes here
    assert versions(poller) == {OLD} and driver.module.refused_unloads == 1
    poller.collector.close()  # evicted: SIGTERM, NVML shut down
    poller.close()
    driver.advance(20)  # the old module unloaded, the new one loaded
    driver.restart_process()  # the kubelet starts the container again
    poller = start()
    await poller.cycle()  # the first cycle of the new process
    assert versions(poller) == {NEW}
    poller.collector.close()
    poller.close()


async def test_a_library_of_another_version_exits_without_publishing(driver, caplog):
    driver.inject(Fault("driver_upgrade", version=NEW, reload=False))  # no module reload
    driver.restart_process()
    poller = start()
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(poller.run(), timeout=5)  # returns: the process is to exit
    assert poller.exit_status == EXIT_NVML
    assert dcgm_series(poller) == []
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "LIB_RM_VERSION_MISMATCH" in line or "Driver/library version mismatch" in line
    poller.close()


async def test_no_driver_at_start_exits_with_one_line(driver, caplog):
    driver.inject(Fault("driver_unloaded", duration=600))  # nobody holds NVML: it goes
    poller = start()
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(poller.run(), timeout=5)
    assert poller.exit_status == EXIT_NVML
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    poller.close()
