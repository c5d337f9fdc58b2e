"""Running-process lists and per-process utilization samples, from the fleet's processes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.devices import Device, GpuState, MiB

if TYPE_CHECKING:
    from exporter.sim.driver import SimDriver

OK = pynvml.NVML_SUCCESS
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
SAMPLE_PERIOD_S = 0.5  # the driver takes a process-utilization sample this often


def _list(dev: Device, now: float, kind: str, count_ref: Any, infos: Any) -> int:
    rows = [row for row in dev.process_rows(now) if row[0].type == kind]
    count = out(count_ref)
    n, wanted = len(rows), count.value
    count.value = n
    if n == 0:
        return OK
    if infos is None or wanted < n:
        return INSUFFICIENT_SIZE
    for i, (p, gi, ci) in enumerate(rows):
        info = infos[i]
        info.pid = p.pid
        info.usedGpuMemory = p.used_memory_mib * MiB
        info.gpuInstanceId = gi
        info.computeInstanceId = ci
    return OK


@calls.device(
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", mig=True
)
def compute_processes(drv: SimDriver, dev: Device, now: float, count_ref: Any, infos: Any) -> int:
    return _list(dev, now, "compute", count_ref, infos)


@calls.device(
    "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", mig=True
)
def graphics_processes(drv: SimDriver, dev: Device, now: float, count_ref: Any, infos: Any) -> int:
    return _list(dev, now, "graphics", count_ref, infos)


def _samples(drv: SimDriver, gpu: GpuState, now: float, last_seen: int) -> list[tuple[Any, ...]]:
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
    drv: SimDriver, gpu: GpuState, now: float, samples: Any, count_ref: Any, last_seen: Any
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
def processes_utilization_info(drv: SimDriver, gpu: GpuState, now: float, info_ref: Any) -> int:
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
