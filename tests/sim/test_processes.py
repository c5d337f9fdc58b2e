"""Process lists and per-process utilization samples."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.handles import handle


def test_time_sliced_gpu_lists_three_processes(default):
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1))
    assert [(p.pid, p.usedGpuMemory >> 20) for p in procs] == [
        (41101, 20480),
        (41102, 16384),
        (41103, 8192),
    ]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle(1))[0].pid == 41101
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle(3)) == []


def test_graphics_processes_are_listed_apart(default):
    compute = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(5))
    graphics = pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle(5))
    assert [p.pid for p in compute] == [41501]
    assert [p.pid for p in graphics] == [41502]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(handle(0)) == []


def test_process_utilization_and_last_seen(default, clock):
    h = handle(1)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert sorted(s.pid for s in samples) == [41101, 41102, 41103]
    assert all(0 <= s.smUtil <= 100 and 0 <= s.memUtil <= 100 for s in samples)
    last = max(s.timeStamp for s in samples)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, last)  # nothing newer yet
    clock.advance(1)
    newer = pynvml.nvmlDeviceGetProcessUtilization(h, last)
    assert min(s.timeStamp for s in newer) > last
    info = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    assert sorted(s.pid for s in info) == [41101, 41102, 41103]


def test_process_utilization_without_processes_raises_nvmlerror_0(default):
    with pytest.raises(pynvml.NVMLError) as err:
        pynvml.nvmlDeviceGetProcessUtilization(handle(3), 0)  # a quirk pynvml users meet
    assert err.value.value == pynvml.NVML_SUCCESS


def test_process_utilization_refused_with_mig(default):
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(handle(6), 0)
