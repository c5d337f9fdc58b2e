"""A modelled driver call lets other Python threads run, as a ctypes call into NVML does."""

from __future__ import annotations

import sys
import threading
import time

import pynvml
import pytest

from tests.sim.handles import handle

SLOW_US = 300_000  # one modelled call of 0.3 s


@pytest.fixture
def no_forced_switch():
    """A switch interval longer than the test: only a released GIL lets another thread run."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    yield
    sys.setswitchinterval(old)


def test_other_thread_runs_during_a_modelled_call(install, no_forced_switch):
    install(
        {
            "latency": {"functions": {"nvmlDeviceGetPowerUsage": SLOW_US}},
            "gpus": [{"model": "Tesla T4"}],
        },
        latency=True,
    )
    h = handle(0)
    ticks = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)  # releases the GIL; taking it back needs the caller to let go

    worker = threading.Thread(target=count, daemon=True)
    worker.start()
    try:
        while ticks[0] == 0:
            time.sleep(0.001)
        before = ticks[0]
        assert pynvml.nvmlDeviceGetPowerUsage(h) > 0
        during = ticks[0] - before
    finally:
        stop.set()
        worker.join(5)
    # A call that held the GIL for its 0.3 s would let the counter move at most once.
    assert during >= 3
