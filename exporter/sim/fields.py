"""nvmlDeviceGetFieldValues: the batch API, one handler per supported field id.

Each entry gets its own nvmlReturn; ids without a handler (or that the board
lacks) come back NOT_SUPPORTED while the call itself succeeds, ids the driver's
branch does not know (exporter/sim/branches.py) INVALID_ARGUMENT. Timestamps are
wall-clock microseconds of the sim instant. On a GPU with ECC turned off the ECC and
retired-page entries (ids 3-31) are left as the caller passed them (NVIDIA bug
2009232, which DCGM works around): nvmlReturn, timestamp and latency untouched.
Blackwell answers NVLink errors in the NVLink5 counters (201-250, summed over
links with scopeId 0xFFFFFFFF) and NOT_SUPPORTED for the older totals (38/45/52/59).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.branches import branch
from exporter.sim.calls import out, value
from exporter.sim.devices import GpuState
from exporter.sim.driverview import DriverView
from exporter.sim.telemetry import threshold_c

OK = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
DOUBLE, UINT, ULONG, ULL, SLL, SINT, USHORT = range(7)
_UNION = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
ALL_LINKS = 0xFFFFFFFF
_ECC_UNINITIALISED = (3, 31)  # ECC counters and retired pages: untouched with ECC off

Result = tuple[int, int, float | int]
Handler = Callable[[GpuState, float, int], Result]


class _FieldValue(ctypes.Structure):
    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


HANDLERS: dict[int, Handler] = {}


def _field(
    *ids: int, vtype: int, when: Callable[[GpuState], bool] = lambda g: True
) -> Callable[[Callable[[GpuState, float], Any]], Callable[[GpuState, float], Any]]:
    """Register fn(gpu, t) -> value for field ids, supported on boards where `when` holds."""

    def deco(fn: Callable[[GpuState, float], Any]) -> Callable[[GpuState, float], Any]:
        def handler(gpu: GpuState, t: float, scope: int) -> Result:
            if not when(gpu):
                return NOT_SUPPORTED, vtype, 0
            return OK, vtype, fn(gpu, t)

        for fid in ids:
            HANDLERS[fid] = handler
        return fn

    return deco


def _ecc(g: GpuState) -> bool:
    return g.model.features.ecc


def _retirement(g: GpuState) -> bool:
    return g.model.features.page_retirement


def _remap(g: GpuState) -> bool:
    return g.model.features.row_remapping


def _nvlink(g: GpuState) -> bool:
    return g.model.nvlinks > 0


def _nvlink4(g: GpuState) -> bool:
    """NVLink with the per-lane DL error totals (NVLink 4 and older: before Blackwell)."""
    return _nvlink(g) and g.model.architecture < pynvml.NVML_DEVICE_ARCH_BLACKWELL


_F = pynvml


@_field(_F.NVML_FI_DEV_ECC_CURRENT, _F.NVML_FI_DEV_ECC_PENDING, vtype=UINT, when=_ecc)
def _ecc_mode(g: GpuState, t: float) -> int:
    return int(g.spec.ecc_enabled)


@_field(_F.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, vtype=ULL, when=_ecc)
def _sbe_vol(g: GpuState, t: float) -> int:
    return g.ecc_volatile[0]


@_field(_F.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, vtype=ULL, when=_ecc)
def _dbe_vol(g: GpuState, t: float) -> int:
    return g.ecc_volatile[1]


@_field(_F.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, vtype=ULL, when=_ecc)
def _sbe_agg(g: GpuState, t: float) -> int:
    return g.ecc_aggregate[0]


@_field(_F.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, vtype=ULL, when=_ecc)
def _dbe_agg(g: GpuState, t: float) -> int:
    return g.ecc_aggregate[1]


@_field(_F.NVML_FI_DEV_RETIRED_SBE, vtype=ULL, when=_retirement)
def _retired_sbe(g: GpuState, t: float) -> int:
    return sum(1 for p in g.retired_pages if p[2] == 0)


@_field(_F.NVML_FI_DEV_RETIRED_DBE, vtype=ULL, when=_retirement)
def _retired_dbe(g: GpuState, t: float) -> int:
    return sum(1 for p in g.retired_pages if p[2] == 1)


@_field(_F.NVML_FI_DEV_RETIRED_PENDING, vtype=ULL, when=_retirement)
def _retired_pending(g: GpuState, t: float) -> int:
    return g.retired_pending


@_field(
    _F.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    _F.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    _F.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    _F.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    vtype=ULL,
    when=_nvlink4,
)
def _nvlink_errors(g: GpuState, t: float) -> int:
    return 0


# NVLink5 counters per link (Blackwell): link recoveries, and errors FEC did not correct
_NVLINK5_PER_LINK = {
    213: 1,  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS
    214: 0,  # ..._LINK_RECOVERY_FAILED_EVENTS
    215: 1,  # ..._LINK_RECOVERY_EVENTS
    219: 2,  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
}


def _nvlink5(per_link: int) -> Handler:
    def handler(g: GpuState, t: float, scope: int) -> Result:
        if not _nvlink(g) or _nvlink4(g):
            return NOT_SUPPORTED, ULL, 0
        if scope == ALL_LINKS:
            return OK, ULL, per_link * g.model.nvlinks
        if scope >= g.model.nvlinks:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, ULL, 0
        return OK, ULL, per_link

    return handler


for _fid, _per_link in _NVLINK5_PER_LINK.items():
    HANDLERS[_fid] = _nvlink5(_per_link)


@_field(_F.NVML_FI_DEV_NVLINK_LINK_COUNT, vtype=UINT, when=_nvlink)
def _nvlink_count(g: GpuState, t: float) -> int:
    return g.model.nvlinks


@_field(_F.NVML_FI_DEV_PERF_POLICY_POWER, vtype=ULL)
def _violation_power(g: GpuState, t: float) -> int:
    return g.power_violation_ns(t)


@_field(_F.NVML_FI_DEV_PERF_POLICY_THERMAL, vtype=ULL)
def _violation_thermal(g: GpuState, t: float) -> int:
    return g.thermal_violation_ns(t)


@_field(
    _F.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
    _F.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    _F.NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    _F.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
    vtype=ULL,
)
def _violation_none(g: GpuState, t: float) -> int:
    return 0


@_field(_F.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, vtype=ULL)
def _violation_low_util(g: GpuState, t: float) -> int:
    return g.low_util_violation_ns(t)


@_field(_F.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS, vtype=ULL)
def _violation_app_clocks(g: GpuState, t: float) -> int:
    return g.power_violation_ns(t) + g.thermal_violation_ns(t)


@_field(_F.NVML_FI_DEV_MEMORY_TEMP, vtype=UINT, when=lambda g: g.model.features.memory_temperature)
def _memory_temp(g: GpuState, t: float) -> int:
    return g.memory_temperature_c(t)


@_field(_F.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, _F.NVML_FI_DEV_ENERGY, vtype=ULL)
def _energy(g: GpuState, t: float) -> int:
    return int(g.energy_mj(t))


@_field(_F.NVML_FI_DEV_PCIE_REPLAY_COUNTER, _F.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, vtype=UINT)
def _pcie_replay(g: GpuState, t: float) -> int:
    return 0


def _nvlink_throughput(rx: bool) -> Handler:
    def handler(g: GpuState, t: float, scope: int) -> Result:
        if not _nvlink(g):
            return NOT_SUPPORTED, ULL, 0
        if scope == ALL_LINKS:
            return OK, ULL, g.nvlink_kib(t, rx, None)
        if scope >= g.model.nvlinks:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, ULL, 0
        return OK, ULL, g.nvlink_kib(t, rx, scope)

    return handler


HANDLERS[_F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX] = _nvlink_throughput(rx=False)
HANDLERS[_F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX] = _nvlink_throughput(rx=True)


@_field(_F.NVML_FI_DEV_REMAPPED_COR, vtype=UINT, when=_remap)
def _remap_cor(g: GpuState, t: float) -> int:
    return g.remapped[0]


@_field(_F.NVML_FI_DEV_REMAPPED_UNC, vtype=UINT, when=_remap)
def _remap_unc(g: GpuState, t: float) -> int:
    return g.remapped[1]


@_field(_F.NVML_FI_DEV_REMAPPED_PENDING, vtype=UINT, when=_remap)
def _remap_pending(g: GpuState, t: float) -> int:
    return g.remapped[2]


@_field(_F.NVML_FI_DEV_REMAPPED_FAILURE, vtype=UINT, when=_remap)
def _remap_failure(g: GpuState, t: float) -> int:
    return g.remapped[3]


@_field(
    *range(_F.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, _F.NVML_FI_DEV_PCIE_COUNT_LANE_ERROR + 1),
    vtype=UINT,
    when=lambda g: g.model.features.pcie_error_counters,
)
def _pcie_errors(g: GpuState, t: float) -> int:
    return 0


@_field(_F.NVML_FI_DEV_POWER_AVERAGE, vtype=UINT)
def _power_average(g: GpuState, t: float) -> int:
    # Average over the last second: the energy counter's slope.
    return round(g.energy_mj(t) - g.energy_mj(t - 1.0))


@_field(_F.NVML_FI_DEV_POWER_INSTANT, vtype=UINT)
def _power_instant(g: GpuState, t: float) -> int:
    return round(g.power_mw(t))


@_field(
    _F.NVML_FI_DEV_POWER_CURRENT_LIMIT,
    _F.NVML_FI_DEV_POWER_DEFAULT_LIMIT,
    _F.NVML_FI_DEV_POWER_MAX_LIMIT,
    vtype=UINT,
)
def _power_limit(g: GpuState, t: float) -> int:
    return round(g.model.power["limit"] * 1000)


@_field(_F.NVML_FI_DEV_POWER_MIN_LIMIT, vtype=UINT)
def _power_min_limit(g: GpuState, t: float) -> int:
    return round(g.model.power["min_limit"] * 1000)


def _threshold(threshold: int) -> Handler:
    def handler(g: GpuState, t: float, scope: int) -> Result:
        temp = threshold_c(g, threshold)
        return (NOT_SUPPORTED, SINT, 0) if temp is None else (OK, SINT, temp)

    return handler


HANDLERS[_F.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT] = _threshold(
    _F.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
)
HANDLERS[_F.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT] = _threshold(
    _F.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
)
HANDLERS[_F.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT] = _threshold(
    _F.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
)
HANDLERS[_F.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT] = _threshold(
    _F.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
)


@_field(_F.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, vtype=ULL)
def _pcie_tx_bytes(g: GpuState, t: float) -> int:
    return g.pcie_bytes(t, rx=False)


@_field(_F.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, vtype=ULL)
def _pcie_rx_bytes(g: GpuState, t: float) -> int:
    return g.pcie_bytes(t, rx=True)


@calls.device("nvmlDeviceGetFieldValues")
def field_values(drv: DriverView, gpu: GpuState, now: float, count: Any, values_ref: Any) -> int:
    n = value(count)
    if n < 0:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    values = out(values_ref)
    if n > len(values):
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    # A plain-struct view of the caller's array: pynvml's printable structs
    # run Python code on every attribute access.
    values = (_FieldValue * n).from_address(ctypes.addressof(values))
    stamp = drv.epoch_us(now)
    latency = round(drv.latency.default_us) if drv.latency.enabled else 0
    unsupported = gpu.unsupported_fields
    known = branch(drv.fleet.driver_version).knows_field
    ecc_off = gpu.model.features.ecc and not gpu.spec.ecc_enabled
    for i in range(n):
        entry = values[i]
        fid = entry.fieldId
        if ecc_off and _ECC_UNINITIALISED[0] <= fid <= _ECC_UNINITIALISED[1]:
            continue  # left as the caller passed it (NVIDIA bug 2009232)
        handler = HANDLERS.get(fid)
        entry.timestamp = stamp
        entry.latencyUsec = latency
        if not known(fid):
            entry.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            continue
        if handler is None or fid in unsupported:
            entry.nvmlReturn = NOT_SUPPORTED
            continue
        rc, vtype, got = handler(gpu, now, entry.scopeId)
        entry.nvmlReturn = rc
        if rc == OK:
            entry.valueType = vtype
            setattr(entry.value, _UNION[vtype], got)
    return OK
