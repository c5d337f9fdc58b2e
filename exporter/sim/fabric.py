"""nvmlDeviceGetGpuFabricInfo and nvmlDeviceGetGpuFabricInfoV: a GPU's NVLink fabric state.

The structures are written as nvml.h lays them out (``state`` and ``healthSummary``
are unsigned chars), through views of the caller's memory, so a caller whose own
declaration differs (pynvml declares ``state`` an unsigned int) reads what a real
driver would leave there. Which versions a driver knows, from the NVML headers:
the unversioned call from NVML 12.0 (R525), ``V`` with version 2 (adds the health
mask) from 12.4 (R550), version 3 (adds the health summary) from 13.0 (R580). An older
version than the driver's newest is accepted; a newer one is ARGUMENT_VERSION_MISMATCH.
GPUs without a fabric (before Hopper, or not on an NVSwitch/NVL system) and MIG
handles answer NOT_SUPPORTED.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out
from exporter.sim.devices import GpuState
from exporter.sim.driverview import DriverView

OK = pynvml.NVML_SUCCESS
_UUID = ctypes.c_ubyte * 16


class _Legacy(ctypes.Structure):  # nvmlGpuFabricInfo_t
    _fields_ = [
        ("clusterUuid", _UUID),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class _V2(ctypes.Structure):  # nvmlGpuFabricInfo_v2_t
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", _UUID),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]


class _V3(ctypes.Structure):  # nvmlGpuFabricInfo_v3_t
    _fields_ = [*_V2._fields_, ("healthSummary", ctypes.c_ubyte)]


def _version(struct: type[ctypes.Structure], n: int) -> int:
    """NVML_STRUCT_VERSION: the structure's size with the version number in the top byte."""
    return ctypes.sizeof(struct) | (n << 24)


V2, V3 = _version(_V2, 2), _version(_V3, 3)


def _driver_major(drv: DriverView) -> int:
    digits = re.match(r"\d+", drv.fleet.driver_version)
    return int(digits.group()) if digits else 0


def _fill(view: Any, gpu: GpuState) -> None:
    spec = gpu.fabric
    assert spec is not None
    ctypes.memmove(ctypes.addressof(view.clusterUuid), spec.uuid_bytes, 16)
    view.status = spec.status_code
    view.cliqueId = spec.clique_id
    view.state = spec.state_code


@calls.device("nvmlDeviceGetGpuFabricInfo")
def fabric_info(drv: DriverView, gpu: GpuState, now: float, info_ref: Any) -> int:
    if gpu.fabric is None:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    _fill(_Legacy.from_address(ctypes.addressof(out(info_ref))), gpu)
    return OK


@calls.device("nvmlDeviceGetGpuFabricInfoV")
def fabric_info_v(drv: DriverView, gpu: GpuState, now: float, info_ref: Any) -> int:
    address = ctypes.addressof(out(info_ref))
    version = ctypes.c_uint.from_address(address).value
    newest = V3 if _driver_major(drv) >= 580 else V2
    if version not in (V2, V3) or version > newest:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if gpu.fabric is None:
        return pynvml.NVML_ERROR_NOT_SUPPORTED
    view = (_V3 if version == V3 else _V2).from_address(address)
    _fill(view, gpu)
    view.healthMask = gpu.fabric.health_mask
    if version == V3:
        view.healthSummary = gpu.fabric.summary_code
    return OK
