"""XIDs already delivered to an event set are counted when the watcher stops or
re-registers (the driver went away, the set of GPUs changed), not freed with the set."""

from __future__ import annotations

import threading
import time

import pytest

from exporter import sim
from exporter.catalog import load
from exporter.collector import Collector
from exporter.config import default_metrics_file
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
