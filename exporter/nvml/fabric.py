"""NVLink fabric state and health per GPU (DCGM fields 170, 171, 173, 174, 175).

On NVSwitch systems (HGX Hopper and Blackwell) and GB200/GB300 NVL racks a GPU
registers with the fabric manager before NVLink peer traffic works;
``nvmlDeviceGetGpuFabricInfoV`` reports where that stands. DCGM reads the same call
(DcgmCacheManager ``ReadFabricManagerStatusField``) and turns it into its fields, which
this module reproduces:

- ``DCGM_FI_DEV_FABRIC_MANAGER_STATUS``: DCGM's dcgmFabricManagerStatus_t, 0 not
  supported, 1 not started, 2 in progress, 3 success, 4 failure (registration completed
  with an error), 5 a state NVML did not document;
- ``DCGM_FI_DEV_FABRIC_MANAGER_ERROR`` (and its older name ``..._ERROR_CODE``): once
  registration completed, 0, or the DCGM return code of NVML's error; absent before;
- ``DCGM_FI_DEV_FABRIC_CLIQUE_ID``: the fabric clique the GPU belongs to;
- ``DCGM_FI_DEV_FABRIC_HEALTH_MASK``: NVML's health bit fields (version 2 of the
  structure, drivers from R550);
- ``DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY``: 0 not supported, 1 healthy, 2 unhealthy,
  3 limited capacity (version 3, drivers from R580).

The structure version is found per GPU: 3, else 2 (ARGUMENT_VERSION_MISMATCH), else the
unversioned ``nvmlDeviceGetGpuFabricInfo`` of R525 to R545 drivers (no health), where DCGM
reports "NVML too old" instead. A GPU without a fabric (NOT_SUPPORTED) is not asked again.
The structures are declared here as nvml.h declares them, independently of the pynvml
version installed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import Field, Source
from exporter.nvml.session import CallFailed, Session, Unavailable

_UUID = ctypes.c_ubyte * 16


class FabricInfoLegacy(ctypes.Structure):  # nvmlGpuFabricInfo_t (no version, no health)
    _fields_ = [
        ("clusterUuid", _UUID),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_v3_t; v2 is the same without healthSummary
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", _UUID),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
        ("healthSummary", ctypes.c_ubyte),
    ]


_V2_SIZE = FabricInfo.healthSummary.offset  # sizeof(nvmlGpuFabricInfo_v2_t): 36
VERSIONS = {3: ctypes.sizeof(FabricInfo) | 3 << 24, 2: _V2_SIZE | 2 << 24}  # NVML_STRUCT_VERSION
_MISMATCH = frozenset({N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH})
COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED

STATUS = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"
ERROR = "DCGM_FI_DEV_FABRIC_MANAGER_ERROR"
ERROR_OLD = "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"
CLIQUE = "DCGM_FI_DEV_FABRIC_CLIQUE_ID"
MASK = "DCGM_FI_DEV_FABRIC_HEALTH_MASK"
SUMMARY = "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"

# DCGM's NvmlReturnToDcgmReturn (common/DcgmUtilities.h): NVML error -> DCGM_ST_* code
_DCGM_RETURN = {
    N.NVML_SUCCESS: 0,
    N.NVML_ERROR_NOT_SUPPORTED: -6,
    N.NVML_ERROR_NO_PERMISSION: -17,
    N.NVML_ERROR_NOT_FOUND: -14,
    N.NVML_ERROR_TIMEOUT: -11,
    N.NVML_ERROR_GPU_IS_LOST: -18,
    N.NVML_ERROR_RESET_REQUIRED: -19,
    N.NVML_ERROR_INVALID_ARGUMENT: -1,
    N.NVML_ERROR_INSUFFICIENT_RESOURCES: -49,
    N.NVML_ERROR_UNINITIALIZED: -56,
}
DCGM_ST_NVML_ERROR = -8
DCGM_ST_BADPARAM = -1  # what DCGM publishes for a state it does not know (DCM:8094-8098)


def manager_status(state: int, status: int) -> int:
    """DCGM's fabric manager status (dcgmFabricManagerStatus_t) from NVML's state and status;
    a state NVML's header does not name gives DCGM_ST_BADPARAM, as DCGM publishes it."""
    if state == COMPLETED:
        return 3 if status == N.NVML_SUCCESS else 4
    return state if 0 <= state < COMPLETED else DCGM_ST_BADPARAM


def values(info: Any, version: int) -> dict[str, int]:
    """Every fabric field's value from an answered structure of ``version`` (1: unversioned)."""
    state, status = int(info.state), int(info.status)
    out = {STATUS: manager_status(state, status), CLIQUE: int(info.cliqueId)}
    if state == COMPLETED:
        out[ERROR] = out[ERROR_OLD] = _DCGM_RETURN.get(status, DCGM_ST_NVML_ERROR)
    if version >= 2:
        out[MASK] = int(info.healthMask)
    if version >= 3:
        out[SUMMARY] = int(info.healthSummary)
    return out


class FabricReader:
    """Reads the fabric fields of each GPU once per cycle, with the newest call it answers."""

    def __init__(self, session: Session, fields: Iterable[Field] = ()) -> None:
        self.session = session
        self._version: dict[str, int] = {}  # GPU key -> 3, 2, 1 (unversioned), 0 (no fabric)
        self._v3, self._legacy = FabricInfo(), FabricInfoLegacy()
        self.set_fields(fields)

    def set_fields(self, fields: Iterable[Field]) -> None:
        """Serve these fields from now on (the fabric ones among them)."""
        self.names = tuple(f.name for f in fields if f.source is Source.FABRIC)

    def forget(self, keys: Iterable[str]) -> None:
        """Drop what is known of GPUs that went away or of a re-initialised driver."""
        for key in keys:
            self._version.pop(key, None)

    def read(self, gpu: Device) -> dict[str, int]:
        """The enabled fabric fields of a physical GPU (none when it has no fabric).

        DeviceLost and DriverGone propagate; another failure leaves this cycle's values out.
        """
        if not self.names or self._version.get(gpu.key) == 0:
            return {}
        try:
            got = self._ask(gpu)
        except Unavailable as e:
            self._version[gpu.key] = 0
            for name in self.names:
                self.session.unsupported_field(name, f"GPU {gpu.index} ({gpu.uuid})", str(e))
            return {}
        except CallFailed:
            return {}  # counted by the session; asked again next cycle
        return {k: v for k, v in got.items() if k in self.names}

    def _ask(self, gpu: Device) -> dict[str, int]:
        version = self._version.get(gpu.key, 3)
        while version >= 2:
            buf = self._v3
            ctypes.memset(ctypes.byref(buf), 0, ctypes.sizeof(buf))
            buf.version = VERSIONS[version]
            try:
                answered = self.session.c_call(
                    "nvmlDeviceGetGpuFabricInfoV", gpu.handle, ctypes.byref(buf), empty=_MISMATCH
                )
            except Unavailable as e:
                if e.code != N.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                version = 1  # a driver before R550: the unversioned call
                break
            if answered:
                self._version[gpu.key] = version
                return values(buf, version)
            version -= 1
        legacy = self._legacy
        ctypes.memset(ctypes.byref(legacy), 0, ctypes.sizeof(legacy))
        self.session.c_call("nvmlDeviceGetGpuFabricInfo", gpu.handle, ctypes.byref(legacy))
        self._version[gpu.key] = 1
        return values(legacy, 1)
