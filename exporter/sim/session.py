"""Session and system functions: init/shutdown (reference counted, like NVML) and versions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value

if TYPE_CHECKING:
    from exporter.sim.driver import SimDriver

OK = pynvml.NVML_SUCCESS


def put_string(buf: Any, size: Any, text: str) -> int:
    """Write text into a caller's char buffer of `size` bytes (with the NUL)."""
    data = text.encode()
    if len(data) + 1 > value(size):
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    out(buf).value = data
    return OK


def _init(drv: SimDriver) -> int:
    with drv.lock:
        now = drv.now()
        if now >= drv.next_fault_at:
            drv.apply_due(now)
        if now < drv.unloaded_until:
            return drv.unloaded_code
        if drv.closed:
            return pynvml.NVML_ERROR_UNINITIALIZED
        drv.init_count += 1
        return OK


@calls.raw("nvmlInitWithFlags")
def init_with_flags(drv: SimDriver, flags: Any) -> int:
    return _init(drv)


@calls.raw("nvmlInit_v2")
def init_v2(drv: SimDriver) -> int:
    return _init(drv)


@calls.raw("nvmlShutdown")
def shutdown(drv: SimDriver) -> int:
    with drv.lock:
        now = drv.now()
        if now < drv.unloaded_until:
            return drv.unloaded_code
        if not drv.init_count:
            return pynvml.NVML_ERROR_UNINITIALIZED
        drv.init_count -= 1
        return OK


@calls.raw("nvmlErrorString")
def error_string(drv: SimDriver, result: Any) -> bytes:
    # pynvml sets restype = c_char_p; a real call would return a char*.
    text = pynvml.NVMLError._errcode_to_string.get(value(result), "Unknown Error")
    return text.encode()


@calls.system("nvmlSystemGetDriverVersion")
def driver_version(drv: SimDriver, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, drv.fleet.driver_version)


@calls.system("nvmlSystemGetNVMLVersion")
def nvml_version(drv: SimDriver, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, drv.fleet.nvml_version)


@calls.system("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version(drv: SimDriver, now: float, version_ref: Any) -> int:
    out(version_ref).value = drv.fleet.cuda_driver_version
    return OK
