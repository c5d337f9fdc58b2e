"""Running-process lists and per-process utilization samples, from the fleet's processes.

The lists are written into the caller's buffer as the driver writes them: entries of
the size its branch uses (24 bytes; 32 on early R535 drivers, whatever struct the
caller declared: exporter/sim/branches.py), memory NVML_VALUE_NOT_AVAILABLE on MIG
(the instance and its MIG-enabled parent), MPS clients only in the MPS list.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.branches import branch
from exporter.sim.calls import out, value
from exporter.sim.devices import Device, GpuState, MiB
from exporter.sim.driverview import DriverView

OK = pynvml.NVML_SUCCESS
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
SAMPLE_PERIOD_S = 0.5  # the driver takes a process-utilization sample this often
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
_V2 = struct.Struct("=I4xQII")  # pid, usedGpuMemory, gpuInstanceId, computeInstanceId
_DETAIL = struct.Struct("=I4xQIIQ")  # ... and usedGpuCcProtectedMemory
_MODES = {0: "compute", 1: "graphics", 2: "mps"}  # nvmlProcessMode_t


def _rows(dev: Device, now: float, kind: str) -> list[tuple[int, int, int, int]]:
    """(pid, used bytes or NOT_AVAILABLE, GPU instance id, compute instance id) of the
    processes of ``kind`` running at ``now``."""
    mig = dev.is_mig or dev.gpu.mig_enabled
    return [
        (p.pid, NOT_AVAILABLE if mig else p.used_memory_mib * MiB, gi, ci)
        for p, gi, ci in dev.process_rows(now)
        if p.type == kind
    ]


def _list(drv: DriverView, dev: Device, now: float, kind: str, count_ref: Any, infos: Any) -> int:
    rows = _rows(dev, now, kind)
    count = out(count_ref)
    n, wanted = len(rows), count.value
    count.value = n
    if n == 0:
        return OK
    if infos is None or wanted < n:
        return INSUFFICIENT_SIZE
    detail = branch(drv.fleet.driver_version).process_entry_bytes == _DETAIL.size
    data = b"".join(_DETAIL.pack(*row, 0) if detail else _V2.pack(*row) for row in rows)
    array = out(infos)
    # into the caller's buffer, as far as it goes: a 32-byte driver overruns 24-byte arrays
    ctypes.memmove(ctypes.addressof(array), data, min(len(data), ctypes.sizeof(array)))
    return OK


@calls.device(
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", mig=True
)
def compute_processes(drv: DriverView, dev: Device, now: float, count_ref: Any, infos: Any) -> int:
    return _list(drv, dev, now, "compute", count_ref, infos)


@calls.device(
    "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", mig=True
)
def graphics_processes(drv: DriverView, dev: Device, now: float, count_ref: Any, infos: Any) -> int:
    return _list(drv, dev, now, "graphics", count_ref, infos)


@calls.device(
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    mig=True,
)
def mps_processes(drv: DriverView, dev: Device, now: float, count_ref: Any, infos: Any) -> int:
    """Clients of the MPS server (Volta and newer), which the compute list leaves out."""
    return _list(drv, dev, now, "mps", count_ref, infos)


@calls.device("nvmlDeviceGetRunningProcessDetailList", mig=True)
def process_detail_list(drv: DriverView, dev: Device, now: float, plist_ref: Any) -> int:
    plist = out(plist_ref)
    if plist.version != pynvml.nvmlProcessDetailList_v1:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    kind = _MODES.get(plist.mode)
    if kind is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    rows = _rows(dev, now, kind)
    if not plist.procArray or plist.numProcArrayEntries < len(rows):
        plist.numProcArrayEntries = len(rows)
        return INSUFFICIENT_SIZE if rows else OK
    for i, (pid, used, gi, ci) in enumerate(rows):
        e = plist.procArray[i]
        e.pid, e.usedGpuMemory, e.gpuInstanceId, e.computeInstanceId = pid, used, gi, ci
        e.usedGpuCcProtectedMemory = 0
    plist.numProcArrayEntries = len(rows)
    return OK


@calls.device("nvmlDeviceGetConfComputeMemSizeInfo")
def conf_compute_mem_size(drv: DriverView, gpu: GpuState, now: float, info_ref: Any) -> int:
    return pynvml.NVML_ERROR_NOT_SUPPORTED  # no confidential computing simulated


def _samples(drv: DriverView, gpu: GpuState, now: float, last_seen: int) -> list[tuple[Any, ...]]:
    """(pid, timestamp us, sm, mem, enc, dec) of the latest sample newer than last_seen."""
    tick = math.floor(now / SAMPLE_PERIOD_S) * SAMPLE_PERIOD_S
    stamp = drv.epoch_us(tick)
    if stamp <= last_seen:
        return []
    factor = gpu.activity.factor(tick)
    rows = []
    for p in gpu.live(now):
        sm = min(100, round(p.sm_util * factor))
        mem = min(100, round(p.mem_util * factor))
        rows.append((p.pid, stamp, sm, mem, 0, 0))
    return rows


@calls.device("nvmlDeviceGetProcessUtilization")
def process_utilization(
    drv: DriverView, gpu: GpuState, now: float, samples: Any, count_ref: Any, last_seen: Any
) -> int:
    if gpu.mig_enabled:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    count = out(count_ref)
    if not gpu.live(now):
        # Nothing runs: success with no samples (pynvml then raises NVMLError(0)).
        count.value = 0
        return OK
    rows = _samples(drv, gpu, now, value(last_seen))
    if not rows:
        return pynvml.NVML_ERROR_NOT_FOUND
    if samples is None or count.value < len(rows):
        count.value = len(rows)
        return INSUFFICIENT_SIZE
    for i, (pid, stamp, sm, mem, enc, dec) in enumerate(rows):
        s = samples[i]
        s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = (
            pid,
            stamp,
            sm,
            mem,
            enc,
            dec,
        )
    count.value = len(rows)
    return OK


@calls.device("nvmlDeviceGetProcessesUtilizationInfo")
def processes_utilization_info(drv: DriverView, gpu: GpuState, now: float, info_ref: Any) -> int:
    info = out(info_ref)
    if info.version != pynvml.ProcessesUtilizationInfo_v1:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if gpu.mig_enabled:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    rows = _samples(drv, gpu, now, info.lastSeenTimeStamp)
    if not rows:
        return pynvml.NVML_ERROR_NOT_FOUND
    if not info.procUtilArray or info.processSamplesCount < len(rows):
        info.processSamplesCount = len(rows)
        return INSUFFICIENT_SIZE
    for i, (pid, stamp, sm, mem, enc, dec) in enumerate(rows):
        s = info.procUtilArray[i]
        s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = (
            pid,
            stamp,
            sm,
            mem,
            enc,
            dec,
        )
        s.jpgUtil = s.ofaUtil = 0
    info.processSamplesCount = len(rows)
    return OK
