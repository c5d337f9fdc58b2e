"""Per-device value queries: utilization, memory, temperature, power, clocks, PCIe, ECC, modes."""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.devices import Device, GpuState
from exporter.sim.driverview import DriverView

OK = pynvml.NVML_SUCCESS
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
SAMPLING_PERIOD_US = 167_000  # what encoder/decoder utilization report as their window


@calls.device("nvmlDeviceGetUtilizationRates")
def utilization(drv: DriverView, gpu: GpuState, now: float, util_ref: Any) -> int:
    if gpu.mig_enabled:
        return NOT_SUPPORTED
    u = out(util_ref)
    busy = gpu.util(now)
    u.gpu = round(busy)
    u.memory = min(100, round(busy * gpu.activity.mem_ratio))
    return OK


@calls.device("nvmlDeviceGetMemoryInfo", mig=True)
def memory_v1(drv: DriverView, dev: Device, now: float, mem_ref: Any) -> int:
    total, reserved, free, used = dev.memory(now)
    m = out(mem_ref)
    m.total, m.free, m.used = total, free, used + reserved
    return OK


@calls.device("nvmlDeviceGetMemoryInfo_v2", mig=True)
def memory_v2(drv: DriverView, dev: Device, now: float, mem_ref: Any) -> int:
    m = out(mem_ref)
    if m.version != pynvml.nvmlMemory_v2:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    m.total, m.reserved, m.free, m.used = dev.memory(now)
    return OK


@calls.device("nvmlDeviceGetTemperature")
def temperature(drv: DriverView, gpu: GpuState, now: float, sensor: Any, temp_ref: Any) -> int:
    if value(sensor) != pynvml.NVML_TEMPERATURE_GPU:
        return INVALID_ARGUMENT
    out(temp_ref).value = gpu.temperature_c(now)
    return OK


@calls.device("nvmlDeviceGetTemperatureV")
def temperature_v(drv: DriverView, gpu: GpuState, now: float, temp_ref: Any) -> int:
    t = out(temp_ref)
    if t.version != pynvml.nvmlTemperature_v1:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if t.sensorType != pynvml.NVML_TEMPERATURE_GPU:
        return INVALID_ARGUMENT
    t.temperature = gpu.temperature_c(now)
    return OK


def threshold_c(gpu: GpuState, threshold: int) -> int | None:
    """A temperature threshold in C, or None where the board has none."""
    temp = gpu.model.temperature
    key = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
    }.get(threshold)
    if key is None or (key == "mem_max" and not gpu.model.features.memory_temperature):
        return None
    return temp[key]


@calls.device("nvmlDeviceGetTemperatureThreshold")
def temperature_threshold(
    drv: DriverView, gpu: GpuState, now: float, threshold: Any, temp_ref: Any
) -> int:
    temp = threshold_c(gpu, value(threshold))
    if temp is None:
        return NOT_SUPPORTED
    out(temp_ref).value = temp
    return OK


@calls.device("nvmlDeviceGetPowerUsage")
def power_usage(drv: DriverView, gpu: GpuState, now: float, mw_ref: Any) -> int:
    out(mw_ref).value = round(gpu.power_mw(now))
    return OK


@calls.device(
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
)
def power_limit(drv: DriverView, gpu: GpuState, now: float, mw_ref: Any) -> int:
    out(mw_ref).value = round(gpu.model.power["limit"] * 1000)
    return OK


@calls.device("nvmlDeviceGetPowerManagementLimitConstraints")
def power_limit_constraints(drv: DriverView, gpu: GpuState, now: float, lo: Any, hi: Any) -> int:
    out(lo).value = round(gpu.model.power["min_limit"] * 1000)
    out(hi).value = round(gpu.model.power["limit"] * 1000)
    return OK


@calls.device("nvmlDeviceGetTotalEnergyConsumption")
def total_energy(drv: DriverView, gpu: GpuState, now: float, mj_ref: Any) -> int:
    out(mj_ref).value = int(gpu.energy_mj(now))
    return OK


@calls.device("nvmlDeviceGetClockInfo")
def clock_info(drv: DriverView, gpu: GpuState, now: float, clock: Any, mhz_ref: Any) -> int:
    mhz = gpu.clock_mhz(value(clock), now)
    if mhz is None:
        return INVALID_ARGUMENT
    out(mhz_ref).value = mhz
    return OK


@calls.device("nvmlDeviceGetMaxClockInfo")
def max_clock_info(drv: DriverView, gpu: GpuState, now: float, clock: Any, mhz_ref: Any) -> int:
    key = {
        pynvml.NVML_CLOCK_GRAPHICS: "graphics_max",
        pynvml.NVML_CLOCK_SM: "sm_max",
        pynvml.NVML_CLOCK_MEM: "mem_max",
        pynvml.NVML_CLOCK_VIDEO: "video_max",
    }.get(value(clock))
    if key is None:
        return INVALID_ARGUMENT
    out(mhz_ref).value = gpu.model.clocks[key]
    return OK


@calls.device("nvmlDeviceGetPcieReplayCounter")
def pcie_replay(drv: DriverView, gpu: GpuState, now: float, count_ref: Any) -> int:
    out(count_ref).value = 0
    return OK


@calls.device("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration")
def pcie_generation(drv: DriverView, gpu: GpuState, now: float, gen_ref: Any) -> int:
    out(gen_ref).value = gpu.model.pcie_generation
    return OK


@calls.device("nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth")
def pcie_width(drv: DriverView, gpu: GpuState, now: float, width_ref: Any) -> int:
    out(width_ref).value = gpu.model.pcie_width
    return OK


@calls.device("nvmlDeviceGetPcieThroughput")
def pcie_throughput(drv: DriverView, gpu: GpuState, now: float, counter: Any, kb_ref: Any) -> int:
    which = value(counter)
    if which not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
        return INVALID_ARGUMENT
    out(kb_ref).value = int(gpu.pcie_rate(now, which == pynvml.NVML_PCIE_UTIL_RX_BYTES) / 1024)
    return OK


@calls.device("nvmlDeviceGetTotalEccErrors")
def total_ecc_errors(
    drv: DriverView, gpu: GpuState, now: float, error_type: Any, counter_type: Any, count_ref: Any
) -> int:
    if not gpu.model.features.ecc or not gpu.spec.ecc_enabled:
        return NOT_SUPPORTED
    kind, counter = value(error_type), value(counter_type)
    if kind not in (0, 1) or counter not in (0, 1):
        return INVALID_ARGUMENT
    counts = gpu.ecc_volatile if counter == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate
    out(count_ref).value = counts[kind]
    return OK


def _retired(gpu: GpuState, cause: Any, count_ref: Any, pages: Any, times: Any) -> int:
    if not gpu.model.features.page_retirement:
        return NOT_SUPPORTED
    c = value(cause)
    if c not in (0, 1):
        return INVALID_ARGUMENT
    rows = [r for r in gpu.retired_pages if r[2] == c]
    count = out(count_ref)
    n, wanted = len(rows), count.value
    count.value = n
    if n == 0:
        return OK
    if pages is None or wanted < n:
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    for i, (address, stamp, _) in enumerate(rows):
        pages[i] = address
        if times is not None:
            times[i] = stamp
    return OK


@calls.device("nvmlDeviceGetRetiredPages")
def retired_pages(
    drv: DriverView, gpu: GpuState, now: float, cause: Any, count_ref: Any, pages: Any
) -> int:
    return _retired(gpu, cause, count_ref, pages, None)


@calls.device("nvmlDeviceGetRetiredPages_v2")
def retired_pages_v2(
    drv: DriverView,
    gpu: GpuState,
    now: float,
    cause: Any,
    count_ref: Any,
    pages: Any,
    times: Any = None,
) -> int:
    return _retired(gpu, cause, count_ref, pages, times)


@calls.device("nvmlDeviceGetRetiredPagesPendingStatus")
def retired_pending(drv: DriverView, gpu: GpuState, now: float, pending_ref: Any) -> int:
    if not gpu.model.features.page_retirement:
        return NOT_SUPPORTED
    out(pending_ref).value = gpu.retired_pending
    return OK


@calls.device("nvmlDeviceGetRemappedRows")
def remapped_rows(
    drv: DriverView, gpu: GpuState, now: float, cor: Any, unc: Any, pending: Any, failure: Any
) -> int:
    if not gpu.model.features.row_remapping:
        return NOT_SUPPORTED
    for ref, count in zip((cor, unc, pending, failure), gpu.remapped, strict=True):
        out(ref).value = count
    return OK


@calls.device("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
def clocks_event_reasons(drv: DriverView, gpu: GpuState, now: float, reasons_ref: Any) -> int:
    out(reasons_ref).value = gpu.clocks_event_reasons(now)
    return OK


@calls.device(
    "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"
)
def supported_clocks_event_reasons(
    drv: DriverView, gpu: GpuState, now: float, reasons_ref: Any
) -> int:
    out(reasons_ref).value = pynvml.nvmlClocksEventReasonAll
    return OK


@calls.device("nvmlDeviceGetFanSpeed")
def fan_speed(drv: DriverView, gpu: GpuState, now: float, percent_ref: Any) -> int:
    if not gpu.model.features.fan:
        return NOT_SUPPORTED
    out(percent_ref).value = gpu.fan_percent(now)
    return OK


@calls.device("nvmlDeviceGetPerformanceState")
def performance_state(drv: DriverView, gpu: GpuState, now: float, pstate_ref: Any) -> int:
    out(pstate_ref).value = gpu.pstate(now)
    return OK


def _codec(gpu: GpuState, present: bool, percent: float, util_ref: Any, period_ref: Any) -> int:
    if gpu.mig_enabled or not present:
        return NOT_SUPPORTED
    out(util_ref).value = round(percent)
    out(period_ref).value = SAMPLING_PERIOD_US
    return OK


@calls.device("nvmlDeviceGetEncoderUtilization")
def encoder_utilization(
    drv: DriverView, gpu: GpuState, now: float, util_ref: Any, period_ref: Any
) -> int:
    return _codec(gpu, gpu.model.features.encoder, gpu.activity.enc, util_ref, period_ref)


@calls.device("nvmlDeviceGetDecoderUtilization")
def decoder_utilization(
    drv: DriverView, gpu: GpuState, now: float, util_ref: Any, period_ref: Any
) -> int:
    return _codec(gpu, gpu.model.features.decoder, gpu.activity.dec, util_ref, period_ref)


@calls.device("nvmlDeviceGetPersistenceMode")
def persistence_mode(drv: DriverView, gpu: GpuState, now: float, mode_ref: Any) -> int:
    out(mode_ref).value = pynvml.NVML_FEATURE_ENABLED
    return OK


@calls.device("nvmlDeviceGetComputeMode")
def compute_mode(drv: DriverView, gpu: GpuState, now: float, mode_ref: Any) -> int:
    out(mode_ref).value = pynvml.NVML_COMPUTEMODE_DEFAULT
    return OK


@calls.device("nvmlDeviceGetEccMode")
def ecc_mode(drv: DriverView, gpu: GpuState, now: float, current: Any, pending: Any) -> int:
    if not gpu.model.features.ecc:
        return NOT_SUPPORTED
    mode = pynvml.NVML_FEATURE_ENABLED if gpu.spec.ecc_enabled else pynvml.NVML_FEATURE_DISABLED
    out(current).value = out(pending).value = mode
    return OK


@calls.device("nvmlDeviceGetP2PStatus")
def p2p_status(
    drv: DriverView, gpu: GpuState, now: float, peer_handle: Any, index: Any, status_ref: Any
) -> int:
    """P2P between two GPUs: over NVLink when both have links, otherwise over PCIe."""
    try:
        peer = drv.handles.get(bytes(peer_handle))
    except TypeError:
        peer = None
    if peer is None or peer.stale or peer.is_mig or peer is gpu:
        return INVALID_ARGUMENT
    if peer.gpu.lost:
        return pynvml.NVML_ERROR_GPU_IS_LOST
    ok = pynvml.NVML_P2P_STATUS_OK
    if value(index) == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
        linked = gpu.model.nvlinks > 0 and peer.gpu.model.nvlinks > 0
        ok = ok if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    out(status_ref).value = ok
    return OK
