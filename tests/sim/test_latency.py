"""The per-call cost model: busy-waits when enabled, costs nothing when disabled."""

from __future__ import annotations

import time

import pynvml
import pytest

from exporter.sim.latency import DEFAULT_COSTS_US, LatencySpec
from tests.sim.handles import handle


def timed(call, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


def test_published_defaults():
    spec = LatencySpec(enabled=True)
    assert spec.cost_s("nvmlDeviceGetUtilizationRates") == pytest.approx(2.5e-6)
    assert spec.cost_s("nvmlDeviceGetMemoryInfo_v2") == pytest.approx(11.6e-6)
    assert spec.cost_s("nvmlDeviceGetFanSpeed") == pytest.approx(137e-6)
    assert DEFAULT_COSTS_US["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 4500
    assert spec.cost_s("nvmlDeviceGetPowerUsage") == pytest.approx(5e-6)
    assert LatencySpec(enabled=False).cost_s("nvmlDeviceGetFanSpeed") == 0


def test_enabled_costs_cpu_time(install):
    install(
        {
            "latency": {"functions": {"nvmlDeviceGetPowerUsage": 2000}},
            "gpus": [{"model": "Tesla T4"}],
        },
        latency=True,
    )
    h = handle(0)
    cpu = time.process_time()
    per_call = timed(lambda: pynvml.nvmlDeviceGetPowerUsage(h), 20)
    assert per_call >= 0.002
    assert time.process_time() - cpu >= 0.02  # a busy-wait, not a sleep


def test_empty_process_list_costs_about_4_5_ms(install):
    install({"gpus": [{"model": "Tesla T4"}]}, latency=True)
    per_call = timed(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0)), 5)
    assert 0.0045 <= per_call < 0.05


def test_disabled_costs_nothing(default):
    h = handle(0)
    assert timed(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h), 50) < 0.001
    assert timed(lambda: pynvml.nvmlDeviceGetPowerUsage(h), 500) < 0.0002


def test_switch_at_run_time(default):
    h = handle(0)
    default.set_latency(True)
    assert timed(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h), 3) >= 0.0045
    default.set_latency(False)
    assert timed(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h), 3) < 0.001
