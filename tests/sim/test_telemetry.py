"""Single-value queries: temperatures, power, clocks, PCIe, ECC, what each model supports."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.handles import handle


def test_temperatures_and_thresholds(mixed):
    h = handle(0)
    t = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == t
    assert 25 <= t < 89
    thresholds = [
        pynvml.nvmlDeviceGetTemperatureThreshold(h, k)
        for k in (
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
        )
    ]
    assert thresholds == [92, 89, 87, 95]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(
            handle(3), pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(h, 1)  # NVML_TEMPERATURE_GPU_MAX: no such sensor here


@pytest.mark.parametrize(
    ("index", "limit_mw", "sm_max", "mem_max"),
    [
        (0, 700_000, 1980, 2619),
        (1, 400_000, 1410, 1215),
        (2, 72_000, 2040, 6251),
        (3, 70_000, 1590, 5001),
    ],
)
def test_power_and_clocks(mixed, clock, index, limit_mw, sm_max, mem_max):
    h = handle(index)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == limit_mw
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == limit_mw
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == sm_max
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == mem_max
    for _ in range(20):
        assert 0 < pynvml.nvmlDeviceGetPowerUsage(h) <= limit_mw
        assert 0 < pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) <= sm_max
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == mem_max
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_VIDEO) > 0
        clock.advance(13)


def test_values_move_slowly_and_stay_in_range(default, clock):
    h = handle(0)
    seen = set()
    for _ in range(60):
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        assert 0 <= u.gpu <= 100 and 0 <= u.memory <= 100
        seen.add(u.gpu)
        clock.advance(2)
    assert len(seen) > 5
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(3)).gpu == 0  # idle GPU stays idle
    assert pynvml.nvmlDeviceGetPerformanceState(handle(3)) == pynvml.NVML_PSTATE_8
    assert (
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(3))
        == pynvml.nvmlClocksEventReasonGpuIdle
    )


def test_pcie(mixed):
    h = handle(0)
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 5
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 16
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle(3)) == 3
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 0
    tx = pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    rx = pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert 0 < tx < rx  # KB/s


def test_ecc_and_memory_error_features_by_generation(mixed):
    h100, t4 = handle(0), handle(3)
    assert (
        pynvml.nvmlDeviceGetTotalEccErrors(
            h100, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
        )
        == 0
    )
    assert pynvml.nvmlDeviceGetRemappedRows(h100) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(
            h100, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(t4)
    assert (
        pynvml.nvmlDeviceGetRetiredPages(t4, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        == []
    )
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(t4) == 0


def test_fan_encoder_decoder(mixed, install):
    for i in range(4):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(handle(i))  # all four are passively cooled
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(handle(0))  # H100 has no NVENC
    assert pynvml.nvmlDeviceGetEncoderUtilization(handle(2)) == [20, 167000]
    assert pynvml.nvmlDeviceGetDecoderUtilization(handle(2)) == [30, 167000]
    install({"gpus": [{"model": "NVIDIA RTX 6000 Ada Generation", "load": {"util": 50}}]})
    assert 30 <= pynvml.nvmlDeviceGetFanSpeed(handle(0)) <= 100
