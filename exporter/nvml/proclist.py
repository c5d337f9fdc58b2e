"""Running-process lists read with the entry layout the driver writes, not the one pynvml assumes.

``nvmlDeviceGet{Compute,MPSCompute}RunningProcesses_v3`` fills an array of entries whose
size depends on the driver: 24 bytes (pid, usedGpuMemory, gpuInstanceId,
computeInstanceId), or 32 on early R535 drivers (before 535.98), which added
usedGpuCcProtectedMemory without a new version. pynvml reads 24 whatever the
driver, so on those drivers every PID after the first is other fields' bytes. The
layout is decided once per process as nvitop does: a driver with
``nvmlDeviceGetConfComputeMemSizeInfo`` but without
``nvmlDeviceGetRunningProcessDetailList`` writes 32; drivers without ``_v3`` (before
R510) are read through ``_v2`` (24 bytes), and without that through the first
version (16 bytes, no instance ids).
"""

from __future__ import annotations

import ctypes
import logging
import struct
from dataclasses import dataclass

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.session import Session

log = logging.getLogger(__name__)

NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE: memory NVML does not give
NO_INSTANCE = 0xFFFFFFFF
_SIZE = frozenset({N.NVML_ERROR_INSUFFICIENT_SIZE})
_V1 = struct.Struct("=I4xQ")  # pid, usedGpuMemory
_V2 = struct.Struct("=I4xQII")  # ... gpuInstanceId, computeInstanceId
_V3_R535 = struct.Struct("=I4xQIIQ")  # ... usedGpuCcProtectedMemory
MAX_ENTRIES = 4096  # one device's list, at most


@dataclass(frozen=True, slots=True)
class Proc:
    """One entry: a host PID, its memory in bytes (None: not available), instance ids."""

    pid: int
    used_bytes: int | None
    gi: int | None
    ci: int | None


class ProcessLists:
    """Reads process lists through the C functions, with the driver's entry layout."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._layout: tuple[str, struct.Struct] | None = None

    def layout(self) -> tuple[str, struct.Struct]:
        """(function suffix, entry struct) of this driver; decided on first use."""
        if self._layout is None:
            if _has("nvmlDeviceGetComputeRunningProcesses_v3"):
                early = _has("nvmlDeviceGetConfComputeMemSizeInfo") and not _has(
                    "nvmlDeviceGetRunningProcessDetailList"
                )
                self._layout = ("_v3", _V3_R535 if early else _V2)
                if early:
                    log.info("early R535 driver: process entries read as 32 bytes")
            elif _has("nvmlDeviceGetComputeRunningProcesses_v2"):
                self._layout = ("_v2", _V2)
            else:
                self._layout = ("", _V1)
        return self._layout

    def read(self, dev: Device, kind: str = "Compute") -> list[Proc]:
        """Processes of ``kind`` (``Compute`` or ``MPSCompute``) on ``dev``; NvmlProblem
        when the call fails (Unavailable where the driver lacks it)."""
        suffix, entry = self.layout()
        function = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
        count = ctypes.c_uint(0)
        if self.session.c_call(function, dev.handle, ctypes.byref(count), None, empty=_SIZE):
            return []  # SUCCESS for no room: nothing runs
        room = min(count.value * 2 + 5, MAX_ENTRIES)  # processes may start meanwhile
        buf = ctypes.create_string_buffer(room * entry.size)
        count.value = room
        self.session.c_call(function, dev.handle, ctypes.byref(count), buf)
        out = []
        for i in range(min(count.value, room)):
            pid, used, *ids = entry.unpack_from(buf, i * entry.size)
            gi, ci = (ids[0], ids[1]) if len(ids) >= 2 else (NO_INSTANCE, NO_INSTANCE)
            out.append(
                Proc(
                    pid,
                    None if used == NOT_AVAILABLE else used,
                    None if gi == NO_INSTANCE else gi,
                    None if ci == NO_INSTANCE else ci,
                )
            )
        return out


def _has(symbol: str) -> bool:
    """Whether the loaded NVML library has the C function ``symbol``."""
    try:
        N._nvmlGetFunctionPointer(symbol)
    except N.NVMLError:
        return False
    return True
