"""XID events through nvmlEventSetWait_v2: delivery, instance ids, timeouts, blocking."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from exporter.sim import Fault
from tests.sim.handles import handle

XID = pynvml.nvmlEventTypeXidCriticalError


def event_set(*indexes, types=XID):
    es = pynvml.nvmlEventSetCreate()
    for i in indexes:
        pynvml.nvmlDeviceRegisterEvents(handle(i), types, es)
    return es


def test_timeout_when_nothing_happens(default):
    es = event_set(0)
    start = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 30)
    assert 0.025 < time.monotonic() - start < 1
    pynvml.nvmlEventSetFree(es)


def test_xid_on_whole_gpu(default):
    es = event_set(0, 1)
    default.inject(Fault("xid", gpu=1, xid=48))
    data = pynvml.nvmlEventSetWait_v2(es, 0)
    assert (data.eventType, data.eventData) == (XID, 48)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert pynvml.nvmlDeviceGetIndex(data.device) == 1


def test_xid_on_mig_instance_and_count(default):
    es = event_set(6)
    default.inject(Fault("xid", gpu=6, xid=31, gi=9, count=2))
    for _ in range(2):
        data = pynvml.nvmlEventSetWait_v2(es, 0)
        assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (31, 9, 0)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_only_registered_gpus_and_later_events(default):
    default.inject(Fault("xid", gpu=0, xid=13))  # before the set existed
    es = event_set(0)
    default.inject(Fault("xid", gpu=2, xid=43))  # not registered
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_wait_wakes_on_injection(default):
    es = event_set(3)
    threading.Timer(0.05, lambda: default.inject(Fault("xid", gpu=3, xid=48))).start()
    start = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(es, 5000)
    assert data.eventData == 48
    assert time.monotonic() - start < 2


def test_wait_wakes_when_a_scheduled_xid_falls_due(default):
    es = event_set(4)
    default.inject(Fault("xid", gpu=4, xid=94, at=30.0))
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)
    threading.Timer(0.05, lambda: default.advance(30)).start()
    start = time.monotonic()
    assert pynvml.nvmlEventSetWait_v2(es, 5000).eventData == 94
    assert time.monotonic() - start < 2


def test_real_time_clock_delivers_due_events(install, clock):
    from exporter import sim

    sim.install(None, latency=False)  # time.monotonic
    pynvml.nvmlInit()
    es = event_set(0)
    sim.current().inject(Fault("xid", gpu=0, xid=45, at=sim.current().now() + 0.1))
    start = time.monotonic()
    assert pynvml.nvmlEventSetWait_v2(es, 3000).eventData == 45
    assert 0.05 < time.monotonic() - start < 2


def test_unsupported_types_and_mig_handles_are_refused(mixed):
    es = pynvml.nvmlEventSetCreate()
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle(0))
    assert supported & XID
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeGpuRecoveryAction, es)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(1), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(mig, XID, es)


def test_time_passing_alone_does_not_wake_waiters(default, monkeypatch):
    # A real driver wakes a thread in nvmlEventSetWait for an event or its timeout, not
    # because time passed: a wake per clock step was CPU the exporter got charged for.
    woken = []
    notify_all = default.cond.notify_all
    monkeypatch.setattr(default.cond, "notify_all", lambda: woken.append(1) or notify_all())
    for _ in range(10):
        default.advance(1)
    assert woken == []
    default.inject(Fault("xid", gpu=4, xid=94, at=default.now() + 5))
    woken.clear()
    default.advance(5)
    assert woken  # the fault fell due: waiters must look
