"""Session and system functions: init/shutdown (reference counted, like NVML) and versions.

nvmlInit fails with GPU_NOT_FOUND on a node without a visible GPU unless called with
NVML_INIT_FLAG_NO_GPUS; it fails as every call does while the kernel module is
unloaded or of another version than the library (exporter/sim/driver.py).
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.driverview import DriverView

OK = pynvml.NVML_SUCCESS
GPU_NOT_FOUND = pynvml.NVML_ERROR_GPU_NOT_FOUND


def put_string(buf: Any, size: Any, text: str) -> int:
    """Write text into a caller's char buffer of `size` bytes (with the NUL)."""
    data = text.encode()
    if len(data) + 1 > value(size):
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    out(buf).value = data
    return OK


def _init(drv: DriverView, flags: int) -> int:
    with drv.lock:
        now = drv.now()
        if now >= drv.next_fault_at:
            drv.apply_due(now)
        if drv.closed:
            return pynvml.NVML_ERROR_UNINITIALIZED
        module = drv.module
        if module.process is None:  # the library is loaded at the process's first nvmlInit
            module.process = module.installed
        error = drv.node_error(now)
        if error not in (OK, pynvml.NVML_ERROR_UNINITIALIZED):
            return error
        if not drv.gpus and not flags & pynvml.NVML_INIT_FLAG_NO_GPUS:
            return GPU_NOT_FOUND  # no GPU visible: init fails unless asked not to
        drv.init_count += 1
        return OK


@calls.raw("nvmlInitWithFlags")
def init_with_flags(drv: DriverView, flags: Any) -> int:
    return _init(drv, value(flags))


@calls.raw("nvmlInit_v2")
def init_v2(drv: DriverView) -> int:
    return _init(drv, 0)


@calls.raw("nvmlShutdown")
def shutdown(drv: DriverView) -> int:
    with drv.lock:
        now = drv.now()
        error = drv.node_error(now)
        if error != OK:
            return error
        drv.init_count -= 1
        drv.released(now)
        return OK


@calls.raw("nvmlErrorString")
def error_string(drv: DriverView, result: Any) -> bytes:
    # pynvml sets restype = c_char_p; a real call would return a char*.
    text = pynvml.NVMLError._errcode_to_string.get(value(result), "Unknown Error")
    return text.encode()


@calls.system("nvmlSystemGetDriverVersion")
def driver_version(drv: DriverView, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, drv.versions()[0])


@calls.system("nvmlSystemGetNVMLVersion")
def nvml_version(drv: DriverView, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, drv.versions()[1])


@calls.system("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version(drv: DriverView, now: float, version_ref: Any) -> int:
    out(version_ref).value = drv.fleet.cuda_driver_version
    return OK
