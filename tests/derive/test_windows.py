"""DCGM_EXP_XID_ERRORS_COUNT and DCGM_EXP_CLOCK_EVENTS_COUNT data over their windows."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from exporter import sim
from exporter.collector import Collector
from exporter.derive.windows import (
    ClockEventWindow,
    Window,
    XidWindow,
    clock_events,
    from_config,
)
from exporter.sim.clock import ManualClock
from exporter.sim.faults import Fault
from tests.support.catalogs import ALL_ROWS


def test_window_forgets_what_is_older_than_the_window():
    w = Window[str](60.0)
    w.add(100.0, {"a": 2})
    w.add(130.0, {"a": 1, "b": 1, "c": 0})
    assert w.counts(150.0) == {"a": 3, "b": 1}
    assert w.counts(165.0) == {"a": 1, "b": 1}
    assert w.counts(190.0) == {}


def test_window_memory_is_bounded():
    w = Window[int](1e9, max_slots=100)
    for t in range(1000):
        w.add(float(t), {t: 1})
    assert sum(w.counts(1000.0).values()) == 100


def test_window_totals_match_the_slots_in_the_window():
    # kept totals against a sum of the slots still inside, at the size bound too
    rng = random.Random(7)
    w = Window[str](10.0, max_slots=6)
    slots: list[tuple[float, dict[str, int]]] = []
    for t in range(300):
        counts = {k: rng.choice((0, 0, 1, 2, 5)) for k in "abcdef" if rng.random() < 0.15}
        w.add(float(t), counts)
        if any(counts.values()):
            slots = [*slots, (float(t), counts)][-6:]
        want: Counter[str] = Counter()
        for at, c in slots:
            if at > t - 10.0:
                want.update({k: n for k, n in c.items() if n > 0})
        got = w.counts(float(t))
        assert got == want and all(n > 0 for n in got.values()), t


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        Window[int](0)


def test_clock_event_names_are_dcgm_exporters():
    assert clock_events(0) == ()
    assert clock_events(0x1) == ("gpu_idle",)
    assert clock_events(0x4 | 0x20 | 0x40) == ("power_cap", "sw_thermal", "hw_thermal")
    assert clock_events(0x8 | 0x80 | 0x100) == ("hw_slowdown", "hw_power_brake", "display_clocks")


def test_windows_sized_from_config():
    class Cfg:
        xid_window_s = 60.0
        clock_events_window_s = 30.0

    xw, cw = from_config(Cfg())
    assert (xw.window.window_s, cw.window.window_s) == (60.0, 30.0)
    xw, cw = from_config(object())  # before the flags exist: dcgm-exporter's 300000 ms
    assert (xw.window.window_s, cw.window.window_s) == (300.0, 300.0)


@pytest.fixture
def node():
    clock = ManualClock()
    driver = sim.install(None, clock=clock)
    col = Collector(ALL_ROWS, "n", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    try:
        yield driver, col, clock
    finally:
        col.close()
        sim.uninstall()


def by_gpu(snap, counts):
    index = {g.key: g.index for g in snap.gpus}
    return {(index[k], label): n for k, label, n in counts.series}


def wait_for_xids(col, total):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if sum(n for *_, n in col.xid.state().counts) >= total:
            return
        time.sleep(0.05)
    raise AssertionError(f"{total} XIDs did not arrive")


def test_xid_counts_over_the_window(node):
    driver, col, clock = node
    win = XidWindow(60.0)
    snap = col.collect()
    counts = win.update(snap)
    assert counts.window_ms == 60000
    assert set(by_gpu(snap, counts)) == {(g.index, None) for g in snap.gpus}  # zero series
    assert set(by_gpu(snap, counts).values()) == {0}
    driver.inject(Fault("xid", gpu=0, xid=95, count=3))
    driver.inject(Fault("xid", gpu=2, xid=48, count=1))
    wait_for_xids(col, 4)
    clock.advance(30.0)
    snap = col.collect()
    got = by_gpu(snap, win.update(snap))
    assert got[(0, "95")] == 3 and got[(2, "48")] == 1
    assert (0, None) not in got and got[(1, None)] == 0
    clock.advance(20.0)  # still inside the 60 s window
    snap = col.collect()
    assert by_gpu(snap, win.update(snap))[(0, "95")] == 3
    clock.advance(45.0)  # the XIDs are now older than the window
    snap = col.collect()
    got = by_gpu(snap, win.update(snap))
    assert got[(0, None)] == 0 and (0, "95") not in got


def test_clock_events_counted_per_cycle_while_active(node):
    driver, col, clock = node
    win = ClockEventWindow(300.0)
    driver.inject(Fault("overheat", gpu=3, temp_c=120.0, duration=1000.0))
    for _ in range(5):
        snap = col.collect()
        counts = win.update(snap)
        clock.advance(10.0)
    got = by_gpu(snap, counts)
    assert got[(3, "sw_thermal")] == 5
    assert got[(3, "hw_thermal")] == 5
    assert all(n <= 5 for n in got.values())
    assert counts.window_ms == 300000
