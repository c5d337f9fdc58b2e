"""XIDs as the driver reports them: every one in the kernel log, 79/119/120 only there;
per-MIG-instance events only for privileged callers; a lost GPU fails its event set;
the first nvmlEventSetWait without instance ids."""

from __future__ import annotations

import ctypes
import re

import pynvml
import pytest

from exporter import sim
from exporter.sim import Fault
from tests.sim.handles import handle

XID = pynvml.nvmlEventTypeXidCriticalError
# DCGM 4.6 DcgmKmsgReader.cpp ParseKmsgLineForXid, the pattern every line must match
DCGM_PATTERN = re.compile(r"^\d+,\d+,(\d+),.*;NVRM: Xid \(PCI:(.*)\): (\d+),.*")


@pytest.fixture
def logged(tmp_path, clock):
    """The default fleet with its kernel log in a file; (driver, path)."""
    path = tmp_path / "kmsg"
    driver = sim.install(None, clock=clock, latency=False, kernel_log=path)
    pynvml.nvmlInit()
    return driver, path


def event_set(*indexes):
    es = pynvml.nvmlEventSetCreate()
    for i in indexes:
        pynvml.nvmlDeviceRegisterEvents(handle(i), XID, es)
    return es


def test_every_xid_is_logged_and_79_119_120_only_there(logged):
    driver, path = logged
    es = event_set(0, 1)
    for xid in (79, 119, 120, 48):
        driver.inject(Fault("xid", gpu=1, xid=xid))
    lines = path.read_text().splitlines()
    parsed = [DCGM_PATTERN.match(line).groups() for line in lines]
    assert [(bus, int(x)) for _, bus, x in parsed] == [
        ("0000:2a:00", 79),
        ("0000:2a:00", 119),
        ("0000:2a:00", 120),
        ("0000:2a:00", 48),
    ]
    bus = pynvml.nvmlDeviceGetPciInfo_v3(handle(1)).busId
    assert bus in ("00000000:2A:00.0", b"00000000:2A:00.0")  # decoded by pynvml 13
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 48
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_instance_xids_need_the_mig_monitor_privilege(install):
    """nvml.h (nvmlEventSetWait_v2): without the privileges, only events that affect the
    whole device are reported."""
    gpu = {"model": "NVIDIA H100 80GB HBM3", "mig": [{"profile": "3g.40gb"}]}
    install({"mig_monitor": False, "gpus": [gpu]})
    es = event_set(0)
    driver = sim.current()
    assert driver is not None
    driver.inject(Fault("xid", gpu=0, xid=31, gi=2))
    driver.inject(Fault("xid", gpu=0, xid=48))
    data = pynvml.nvmlEventSetWait_v2(es, 0)
    assert (data.eventData, data.gpuInstanceId) == (48, 0xFFFFFFFF)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)


def test_a_lost_gpu_fails_every_wait_on_its_set(default):
    """GPU_IS_LOST is the set's answer, not one event's: the other GPU's events wait."""
    es = event_set(0, 1)
    default.inject(Fault("xid", gpu=0, xid=13))
    default.inject(Fault("lost", gpu=1))
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlEventSetWait_v2(es, 0)
    fresh = event_set(0)  # a set without the lost GPU works
    default.inject(Fault("xid", gpu=0, xid=43))
    assert pynvml.nvmlEventSetWait_v2(fresh, 0).eventData == 43


def test_the_first_wait_has_no_instance_ids(default):
    """nvmlEventSetWait (before _v2) fills device, eventType and eventData only."""
    es = event_set(6)
    default.inject(Fault("xid", gpu=6, xid=31, gi=9))
    data = pynvml.c_nvmlEventData_t()
    data.gpuInstanceId = data.computeInstanceId = 0xABCD
    fn = pynvml._nvmlGetFunctionPointer("nvmlEventSetWait")
    assert fn(es, ctypes.byref(data), ctypes.c_uint(0)) == pynvml.NVML_SUCCESS
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (31, 0xABCD, 0xABCD)
