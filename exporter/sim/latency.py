"""The per-call cost model: a busy-wait that costs CPU like a real driver call."""

from __future__ import annotations

import time
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


@dataclass(frozen=True)
class LatencySpec:
    """What each simulated NVML call costs, in microseconds; disabled costs nothing."""

    enabled: bool = False
    default_us: float = DEFAULT_US
    per_field_us: float = PER_FIELD_US
    functions: Mapping[str, float] = field(default_factory=dict)

    def cost_s(self, name: str) -> float:
        """Seconds one call of `name` busy-waits (0 when the model is disabled)."""
        if not self.enabled:
            return 0.0
        us = self.functions.get(name, DEFAULT_COSTS_US.get(name, self.default_us))
        return us / 1e6


def spin(seconds: float) -> None:
    """Busy-wait `seconds` on perf_counter, holding the CPU like a driver call does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
