"""XIDs already delivered to an event set are counted when the watcher stops or
re-registers (the driver went away, the set of GPUs changed), not freed with the set."""

from __future__ import annotations

import threading
import time

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.sim import Fault, ManualClock

CATALOG = load(default_metrics_file())
MIXED = "exporter/sim/fleets/mixed.yaml"  # GPU 1: A100 with MIG instances at GI 2, 4, 7, 8


@pytest.fixture
def node():
    clock = ManualClock()
    driver = sim.install(MIXED, clock=clock, latency=False)
    col = Collector(CATALOG, "node-a")
    try:
        clock.advance(1.0)
        col.collect()  # the first cycle registers every GPU for XIDs
        assert col.xid is not None
        yield driver, col.xid
    finally:
        col.close()
        sim.uninstall()


def until(what: str, check, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def test_events_queued_when_the_watcher_stops_are_counted(node):
    """A burst of three on a MIG instance arrives just as the collector stops the watcher.

    The watcher thread is held after taking the first event off the set (it waits for
    the counters' lock), the stop is requested, then the thread is let go: the two
    events still in the set must be counted, not freed with it.
    """
    driver, watcher = node
    [evset] = driver.events.sets.values()
    stopper = threading.Thread(target=watcher.stop)
    with watcher._lock:  # the thread blocks in its first _record, holding event 1
        driver.inject(Fault("xid", gpu=1, gi=4, xid=31, count=3))
        until("the watcher to take the first event", lambda: len(evset.queue) == 2)
        stopper.start()
        until("the stop to be requested", watcher._stop.is_set)
    stopper.join(10)
    assert not stopper.is_alive()
    assert [(gi, ci, xid, n) for _, gi, ci, xid, n in watcher.state().counts] == [(4, 0, 31, 3)]
    assert evset.freed  # the set was still freed


@pytest.mark.parametrize("grace", [0.05, None])
def test_a_short_grace_leaves_nvml_to_the_exit_and_the_thread_ends_by_itself(grace, monkeypatch):
    """The idle XID thread waits a whole second per call. On SIGTERM the exporter gives it a
    short grace: still waiting then, NVML is not shut down under it and the stop goes on;
    the thread ends when its wait does, its set freed. Without a grace, the close waits for
    the thread and shuts NVML down."""
    from exporter.nvml.xid import events

    clock = ManualClock()
    driver = sim.install(MIXED, clock=clock, latency=False)
    monkeypatch.setattr(events, "WAIT_MS", 1500)
    col = Collector(CATALOG, "node-a")
    try:
        clock.advance(1.0)
        col.collect()
        [evset] = driver.events.sets.values()
        thread = col.xid._thread
        time.sleep(0.1)  # the thread is in its first wait
        t0 = time.monotonic()
        col.close(grace)
        if grace is None:
            assert driver.init_count == 0 and evset.freed and not thread.is_alive()
            return
        assert time.monotonic() - t0 < 1.0  # not the rest of the 1.5 s wait
        assert driver.init_count > 0  # NVML left for the exit to release
        until("the thread to end at its wait's end", lambda: not thread.is_alive())
        assert evset.freed
    finally:
        col.close()
        sim.uninstall()
