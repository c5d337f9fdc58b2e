"""NVML event sets: XID (and ECC, MIG-change) events delivered through nvmlEventSetWait_v2
(or nvmlEventSetWait, whose event data lacks the MIG instance ids).

An event reaches a set when the set registered the event's GPU for its type
before the event happened (the sets themselves: exporter/sim/eventsets.py).
nvmlEventSetWait_v2 blocks on the driver's condition variable (the driver lock
is released while waiting) and wakes when an event is published, when sim time
moves (ManualClock) or when a scheduled fault falls due.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.clock import ManualClock
from exporter.sim.devices import GpuState
from exporter.sim.driverview import DriverView
from exporter.sim.eventsets import Event

_DEVICE_OFFSET = pynvml.c_nvmlEventData_t.device.offset


@calls.system("nvmlEventSetCreate")
def event_set_create(drv: DriverView, now: float, set_ref: Any) -> int:
    es = drv.events.create()
    ctypes.memmove(ctypes.addressof(out(set_ref)), es.key, len(es.key))
    return pynvml.NVML_SUCCESS


@calls.system("nvmlEventSetFree")
def event_set_free(drv: DriverView, now: float, set_handle: Any) -> int:
    es = drv.events.sets.pop(_key(set_handle), None)
    if es is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    es.freed = True
    drv.cond.notify_all()
    return pynvml.NVML_SUCCESS


@calls.device("nvmlDeviceGetSupportedEventTypes")
def supported_event_types(drv: DriverView, gpu: GpuState, now: float, types_ref: Any) -> int:
    out(types_ref).value = gpu.supported_events()
    return pynvml.NVML_SUCCESS


@calls.device("nvmlDeviceRegisterEvents")
def register_events(drv: DriverView, gpu: GpuState, now: float, types: Any, set_handle: Any) -> int:
    mask = value(types)
    if mask & ~gpu.supported_events():
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    es = drv.events.sets.get(_key(set_handle))
    if es is None:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    old_mask, since = es.registered.get(gpu.index, (0, now))
    es.registered[gpu.index] = (old_mask | mask, since)
    return pynvml.NVML_SUCCESS


@calls.raw("nvmlEventSetWait_v2")
def event_set_wait(drv: DriverView, set_handle: Any, data_ref: Any, timeout_ms: Any) -> int:
    return _wait(drv, set_handle, data_ref, timeout_ms, v2=True)


@calls.raw("nvmlEventSetWait")
def event_set_wait_v1(drv: DriverView, set_handle: Any, data_ref: Any, timeout_ms: Any) -> int:
    """The first version: nvmlEventData_t without gpuInstanceId and computeInstanceId."""
    return _wait(drv, set_handle, data_ref, timeout_ms, v2=False)


def _wait(drv: DriverView, set_handle: Any, data_ref: Any, timeout_ms: Any, v2: bool) -> int:
    deadline = time.monotonic() + value(timeout_ms) / 1000.0
    manual = isinstance(drv.clock, ManualClock)
    key = _key(set_handle)
    with drv.cond:
        while True:
            now = drv.now()
            if now >= drv.next_fault_at:
                drv.apply_due(now)
            error = drv.node_error(now)
            if error:
                return error
            if v2 and "nvmlEventSetWait_v2" in drv.unsupported_functions:
                return pynvml.NVML_ERROR_NOT_SUPPORTED  # a node-wide not_supported fault
            es = drv.events.sets.get(key)
            if es is None or es.freed:
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            # The set answers for all its GPUs: one fallen off the bus fails every wait,
            # whatever the set holds for the others.
            if any(drv.gpus[i].lost for i in es.registered):
                return pynvml.NVML_ERROR_GPU_IS_LOST
            if es.queue:
                _fill(out(data_ref), es.queue.popleft(), v2)
                return pynvml.NVML_SUCCESS
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return pynvml.NVML_ERROR_TIMEOUT
            if not manual and drv.next_fault_at < math.inf:
                # Wake when the next scheduled fault falls due (sim s ~ real s here).
                remaining = min(remaining, max(drv.next_fault_at - now, 0.001), 0.05)
            drv.cond.wait(remaining)


def _fill(data: Any, event: Event, v2: bool) -> None:
    ctypes.memmove(ctypes.addressof(data) + _DEVICE_OFFSET, event.gpu.key, len(event.gpu.key))
    data.eventType = event.type
    data.eventData = event.data
    if v2:
        data.gpuInstanceId = event.gi
        data.computeInstanceId = event.ci


def _key(handle: Any) -> bytes:
    try:
        return bytes(handle)
    except TypeError:
        return b""
