"""The per-call cost model: CPU burned outside the GIL, like a real driver call.

A real NVML call goes through ctypes, which releases the GIL while the
driver works (mostly ioctls into the kernel module): the call costs the
process CPU, but other Python threads run meanwhile. The model does the same:
it burns the modelled time in a C routine that releases the GIL
(``zlib.crc32`` over a buffer larger than 5 KiB), and only the last few
microseconds, shorter than one such chunk, busy-wait in Python.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Published medians, microseconds per NVML C call. pynvml asks for a process
# list twice when it is not empty (size, then data): that costs 2 x 4.5 ms.
DEFAULT_COSTS_US: Mapping[str, float] = MappingProxyType(
    {
        "nvmlDeviceGetUtilizationRates": 2.5,
        "nvmlDeviceGetMemoryInfo": 11.6,
        "nvmlDeviceGetMemoryInfo_v2": 11.6,
        "nvmlDeviceGetFanSpeed": 137.0,
        "nvmlDeviceGetComputeRunningProcesses_v2": 4500.0,
        "nvmlDeviceGetComputeRunningProcesses_v3": 4500.0,
        "nvmlDeviceGetGraphicsRunningProcesses_v2": 4500.0,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 4500.0,
    }
)
DEFAULT_US = 5.0
PER_FIELD_US = 1.0

# zlib.crc32 releases the GIL for inputs over 5 KiB; 16 KiB is about 10 us of CPU.
_CHUNK = bytes(16 * 1024)


@dataclass(frozen=True)
class LatencySpec:
    """What each simulated NVML call costs, in microseconds; disabled costs nothing."""

    enabled: bool = False
    default_us: float = DEFAULT_US
    per_field_us: float = PER_FIELD_US
    functions: Mapping[str, float] = field(default_factory=dict)

    def cost_s(self, name: str) -> float:
        """Seconds of CPU one call of `name` burns (0 when the model is disabled)."""
        if not self.enabled:
            return 0.0
        us = self.functions.get(name, DEFAULT_COSTS_US.get(name, self.default_us))
        return us / 1e6


def _chunk_seconds() -> float:
    """How long one GIL-free chunk takes on this machine (the quickest of a few tries)."""
    best = 1.0
    for _ in range(5):
        t0 = time.perf_counter()
        zlib.crc32(_CHUNK)
        best = min(best, time.perf_counter() - t0)
    return best


_CHUNK_S = _chunk_seconds()


def spin(seconds: float) -> None:
    """Burn `seconds` of wall time on the CPU, with the GIL released for all but the tail.

    While more than one chunk's time is left the GIL is released in chunks of
    about 10 us; the rest (all of a call shorter than a chunk) is a busy-wait
    on perf_counter, which holds the GIL for at most about one chunk.
    """
    clock = time.perf_counter
    now = clock()
    end = now + seconds
    crc, chunk, step = zlib.crc32, _CHUNK, _CHUNK_S
    while end - now > step:
        crc(chunk)
        now = clock()
    while clock() < end:
        pass
