"""Many threads on one simulated driver: no errors, no deadlock, waits do not block calls."""

from __future__ import annotations

import contextlib
import threading
import time

import pynvml

from exporter.sim import Fault
from tests.sim.handles import handle, mig_handles


def test_threads_share_the_driver(default, clock):
    handles = [handle(i) for i in range(8)]
    migs = mig_handles(handles[7])
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handles[0], pynvml.nvmlEventTypeXidCriticalError, es)
    errors: list[BaseException] = []
    xids: list[int] = []
    stop = threading.Event()

    def poll(h, mig):
        try:
            for _ in range(300):
                pynvml.nvmlDeviceGetPowerUsage(h)
                pynvml.nvmlDeviceGetFieldValues(h, [83, 185, 197])
                pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
        except BaseException as e:  # surfaced by the assert below
            errors.append(e)

    def wait_events():
        while not stop.is_set():
            with contextlib.suppress(pynvml.NVMLError_Timeout):
                xids.append(pynvml.nvmlEventSetWait_v2(es, 50).eventData)

    waiter = threading.Thread(target=wait_events)
    waiter.start()
    workers = [threading.Thread(target=poll, args=(h, migs[i % 4])) for i, h in enumerate(handles)]
    for w in workers:
        w.start()
    for n in range(5):
        default.inject(Fault("xid", gpu=0, xid=40 + n))
        clock.advance(1)
    for w in workers:
        w.join(timeout=30)
    deadline = time.monotonic() + 5
    while len(xids) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    waiter.join(timeout=5)
    assert not errors
    assert xids == [40, 41, 42, 43, 44]
