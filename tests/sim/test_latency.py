"""The per-call cost model: busy-waits when enabled, costs nothing when disabled."""

from __future__ import annotations

import time

import pynvml

from tests.sim.handles import handle


def timed(call, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


# Published medians of these NVML calls (a consumer GPU; nvitop's and NVML users'
# microbenchmarks, as docs/simulator.md cites them), in microseconds, and the model's
# figure for any other call.
PUBLISHED_US = {
    "utilization": 2.5,  # nvmlDeviceGetUtilizationRates
    "memory": 11.6,  # nvmlDeviceGetMemoryInfo (v2)
    "fan": 137.0,  # nvmlDeviceGetFanSpeed
    "power": 5.0,  # any other call (nvmlDeviceGetPowerUsage here)
}
SLACK_US = 25.0  # scheduling noise allowed above a published figure in the fastest call


def _fastest_us(call, n: int = 60) -> float:
    """The fastest of n calls, in microseconds: what the call costs without preemption."""
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def test_published_defaults(install):
    """With the model on, each pynvml call through the simulated driver takes its
    published cost on top of what the same call takes with the model off."""
    driver = install({"gpus": [{"model": "NVIDIA RTX 6000 Ada Generation"}]})  # has a fan
    h = handle(0)
    calls = {
        "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
        "fan": lambda: pynvml.nvmlDeviceGetFanSpeed(h),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
    }
    bare = {name: _fastest_us(call) for name, call in calls.items()}
    driver.set_latency(True)
    costed = {name: _fastest_us(call) for name, call in calls.items()}
    for name, published in PUBLISHED_US.items():
        # a busy-wait: never shorter than the published cost, whatever the load
        assert costed[name] >= published, (name, costed[name])
        assert costed[name] - bare[name] <= published + SLACK_US, (name, costed, bare)
    driver.set_latency(False)
    assert _fastest_us(calls["fan"]) < PUBLISHED_US["fan"]  # the model off costs nothing


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
