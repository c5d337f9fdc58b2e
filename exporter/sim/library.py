"""SimLibrary: what pynvml.nvmlLib points at while the simulation is installed.

pynvml looks each C function up by name on nvmlLib; here every implemented
NVML function is an attribute (a plain function, so pynvml may set .restype
on it) wrapping the implementation with the checks a real driver makes:
driver loaded, library initialized, handle valid, GPU not lost, function
supported, plus the latency model and `slow` faults. A function the simulated
driver lacks (its branch is older than the function, exporter/sim/branches.py, or the
fleet names it in missing_functions) is simply not an attribute, so pynvml raises
FunctionNotFound. One library stands for one process: a restarted process
(SimDriver.restart_process) gets a new one.

The modules that implement the functions are imported here, which fills the
registry (exporter/sim/calls.py); they see the driver as a DriverView
(exporter/sim/driverview.py) and import neither this module nor the driver's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pynvml

from exporter.sim import (  # noqa: F401  (importing a module registers its functions)
    events,
    fabric,
    fields,
    gpm,
    identity,
    processes,
    session,
    telemetry,
)
from exporter.sim.branches import branch
from exporter.sim.calls import FUNCTIONS, Call, value
from exporter.sim.devices import Device
from exporter.sim.driverview import DriverView
from exporter.sim.latency import spin

SUCCESS = pynvml.NVML_SUCCESS
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST


@functools.cache
def implemented_names() -> frozenset[str]:
    """Every NVML C function name the simulator implements."""
    return frozenset(FUNCTIONS)


class SimLibrary:
    """The simulated libnvidia-ml: one attribute per implemented NVML C function."""

    def __init__(self, driver: DriverView) -> None:
        self._driver = driver
        self.rebuild()

    def rebuild(self) -> None:
        """(Re)create the function attributes, e.g. after the latency model changed."""
        driver = self._driver
        fleet = driver.fleet
        missing = fleet.missing_functions | branch(fleet.driver_version).missing_functions
        for name, call in FUNCTIONS.items():
            if name in missing:
                self.__dict__.pop(name, None)
                continue
            setattr(self, name, _wrap(driver, call))

    def __repr__(self) -> str:
        return f"<SimLibrary {self._driver.fleet.source}>"


def _wrap(driver: DriverView, call: Call) -> Callable[..., Any]:
    cost = driver.latency.cost_s(call.name)
    if call.kind == "device":
        fn = _device_call(driver, call, cost)
    elif call.kind == "system":
        fn = _system_call(driver, call, cost)
    else:
        fn = _raw_call(driver, call, cost)
    fn.__name__ = fn.__qualname__ = call.name
    return fn


def _raw_call(driver: DriverView, call: Call, cost: float) -> Callable[..., Any]:
    impl = call.impl

    def fn(*args: Any) -> Any:
        if cost:
            spin(cost)
        return impl(driver, *args)

    return fn


def _node_error(driver: DriverView, now: float) -> int:
    """Apply due faults; then the code every call returns now, or SUCCESS (lock held)."""
    if now >= driver.next_fault_at:
        driver.apply_due(now)
    return driver.node_error(now)


def _system_call(driver: DriverView, call: Call, cost: float) -> Callable[..., int]:
    impl, name, lock = call.impl, call.name, driver.lock

    def fn(*args: Any) -> int:
        if cost:
            spin(cost)
        with lock:
            now = driver.now()
            error = _node_error(driver, now)
            if error:
                return error
            if name in driver.unsupported_functions:
                return NOT_SUPPORTED
            delay = driver.slow_seconds(name, None, now) if name in driver.slow_rules else 0.0
            if not delay:
                return impl(driver, now, *args)
        time.sleep(delay)
        with lock:
            return impl(driver, driver.now(), *args)

    return fn


def _device(driver: DriverView, handle: Any, name: str, allow_mig: bool) -> Device | int:
    """The device a handle names, or the error code a call on it returns (lock held)."""
    try:
        dev = driver.handles.get(bytes(handle))
    except TypeError:
        dev = None
    if dev is None or dev.stale:
        return INVALID_ARGUMENT
    gpu = dev.gpu
    if gpu.lost:
        return GPU_IS_LOST
    if name in gpu.unsupported_functions or (dev.is_mig and not allow_mig):
        return NOT_SUPPORTED
    return dev


def _device_call(driver: DriverView, call: Call, cost: float) -> Callable[..., int]:
    impl, name, lock, allow_mig = call.impl, call.name, driver.lock, call.mig
    per_field = driver.latency.per_field_us / 1e6 if name == "nvmlDeviceGetFieldValues" else 0.0
    if not driver.latency.enabled:
        per_field = 0.0

    def fn(handle: Any, *args: Any) -> int:
        if cost or per_field:
            spin(cost + per_field * value(args[0]) if per_field else cost)
        with lock:
            now = driver.now()
            dev = _node_error(driver, now) or _device(driver, handle, name, allow_mig)
            if isinstance(dev, int):
                return dev
            delay = (
                driver.slow_seconds(name, dev.gpu.index, now) if name in driver.slow_rules else 0.0
            )
            if not delay:
                return impl(driver, dev, now, *args)
        # A slow call blocks without holding the driver lock.
        time.sleep(delay)
        with lock:
            if dev.gpu.lost:
                return GPU_IS_LOST
            if dev.stale:
                return INVALID_ARGUMENT
            return impl(driver, dev, driver.now(), *args)

    return fn
