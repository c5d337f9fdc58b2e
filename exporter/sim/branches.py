"""What a driver branch has: its NVML functions, the field ids it knows, its struct layouts.

A fleet's ``driver_version`` picks the branch. Functions and field ids appear in the
NVML release of their first header (NVIDIA's nvml.h, one release per branch):
a driver older than that lacks the C function (pynvml raises FunctionNotFound)
or answers the field id with INVALID_ARGUMENT, as a real one does for an id it
does not know. Early R535 drivers (before 535.98) wrote 32-byte entries from
``nvmlDeviceGet*RunningProcesses_v3``, where every other driver writes 24; they are
recognised, as nvitop does, by having ``nvmlDeviceGetConfComputeMemSizeInfo`` without
``nvmlDeviceGetRunningProcessDetailList``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

Version = tuple[int, ...]

# C function -> the first driver version whose NVML has it.
FIRST_FUNCTION: dict[str, Version] = {
    **dict.fromkeys(
        (
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            "nvmlDeviceGetMemoryInfo_v2",
        ),
        (510,),
    ),
    **dict.fromkeys(
        (
            "nvmlGpmQueryDeviceSupport",
            "nvmlGpmSampleAlloc",
            "nvmlGpmSampleFree",
            "nvmlGpmSampleGet",
            "nvmlGpmMigSampleGet",
            "nvmlGpmMetricsGet",
        ),
        (525,),
    ),
    **dict.fromkeys(
        (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetSupportedClocksEventReasons",
            "nvmlDeviceGetConfComputeMemSizeInfo",
        ),
        (535,),
    ),
    "nvmlDeviceGetRunningProcessDetailList": (535, 98),
    "nvmlDeviceGetGpuFabricInfoV": (550,),
    "nvmlDeviceGetProcessesUtilizationInfo": (550,),
    "nvmlDeviceGetTemperatureV": (570,),
}

# Field id ranges -> the first driver version whose NVML knows them.
# nvml.h's history (NVIDIA/go-nvml's vendored headers): 186-196 first in NVML 12.2 (R535),
# 197-198 in 12.5 (R555), 201 and later in 12.6 (R560); 199-200 kept with 197-198.
FIRST_FIELD: tuple[tuple[range, Version], ...] = (
    (range(186, 197), (535,)),  # POWER_INSTANT, power limits, energy, temperature limits
    (range(197, 201), (555,)),  # PCIe TX/RX byte counters (197/198), 199, 200
    (range(201, 251), (560,)),  # NVLink5 COUNT fields, FEC history
)
NEWEST_FIELD = 250  # ids above: unknown to every simulated driver

PROCESS_ENTRY_BYTES = 24  # nvmlProcessInfo_v2_t: pid, usedGpuMemory, gpuInstanceId, ...
EARLY_R535_ENTRY_BYTES = 32  # ... and usedGpuCcProtectedMemory (nvmlProcessDetail_v1_t)


def parse_version(text: str) -> Version:
    """``"535.54.03"`` -> (535, 54, 3); no leading number -> (0,)."""
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts) if parts else (0,)


@dataclass(frozen=True)
class Branch:
    """One driver version's NVML, as the simulator answers for it."""

    version: Version
    missing_functions: frozenset[str]
    process_entry_bytes: int

    def knows_field(self, field_id: int) -> bool:
        """Whether this driver's NVML knows the field id (else INVALID_ARGUMENT)."""
        if field_id > NEWEST_FIELD:
            return False
        for ids, first in FIRST_FIELD:
            if field_id in ids:
                return self.version >= first
        return True


@functools.cache
def branch(driver_version: str) -> Branch:
    """The branch of a driver version string such as ``"580.95.05"``."""
    version = parse_version(driver_version)
    missing = frozenset(f for f, first in FIRST_FUNCTION.items() if version < first)
    early_r535 = (535,) <= version < (535, 98)
    return Branch(
        version=version,
        missing_functions=missing,
        process_entry_bytes=EARLY_R535_ENTRY_BYTES if early_r535 else PROCESS_ENTRY_BYTES,
    )
