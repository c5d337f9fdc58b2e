"""nvmlDeviceGetFieldValues: per-entry return codes, value types, timestamps, counters."""

from __future__ import annotations

import time

import pynvml
import pytest

from tests.sim.handles import handle

F = pynvml
COUNTERS = [
    F.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    F.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    F.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    (F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
    (F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
    F.NVML_FI_DEV_PERF_POLICY_POWER,
]


def read(h, ids):
    return {(v.fieldId, v.scopeId): v for v in pynvml.nvmlDeviceGetFieldValues(h, ids)}


def test_entries_have_type_value_and_timestamp(mixed):
    before = time.time() * 1e6
    got = read(
        handle(0),
        [
            F.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            F.NVML_FI_DEV_MEMORY_TEMP,
            F.NVML_FI_DEV_POWER_INSTANT,
            F.NVML_FI_DEV_POWER_CURRENT_LIMIT,
            F.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
            F.NVML_FI_DEV_REMAPPED_PENDING,
            F.NVML_FI_DEV_NVLINK_GET_SPEED,  # a field id the simulator has no value for
            1234,  # a field id no driver knows
        ],
    )
    ok = {fid: v for (fid, _), v in got.items() if v.nvmlReturn == pynvml.NVML_SUCCESS}
    assert got[(F.NVML_FI_DEV_NVLINK_GET_SPEED, 0)].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert got[(1234, 0)].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert ok[F.NVML_FI_DEV_ECC_DBE_VOL_TOTAL].valueType == F.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert ok[F.NVML_FI_DEV_ECC_DBE_VOL_TOTAL].value.ullVal == 0
    assert ok[F.NVML_FI_DEV_MEMORY_TEMP].valueType == F.NVML_VALUE_TYPE_UNSIGNED_INT
    assert 20 < ok[F.NVML_FI_DEV_MEMORY_TEMP].value.uiVal < 95
    assert ok[F.NVML_FI_DEV_POWER_CURRENT_LIMIT].value.uiVal == 700_000
    assert ok[F.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT].value.siVal == 89
    power = ok[F.NVML_FI_DEV_POWER_INSTANT].value.uiVal
    assert power == pynvml.nvmlDeviceGetPowerUsage(handle(0))
    for v in got.values():
        assert before - 5e6 < v.timestamp < time.time() * 1e6 + 5e6


@pytest.mark.parametrize(
    ("index", "unsupported"),
    [
        (
            2,
            [
                F.NVML_FI_DEV_MEMORY_TEMP,
                F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                F.NVML_FI_DEV_RETIRED_DBE,
            ],
        ),
        (3, [F.NVML_FI_DEV_REMAPPED_UNC, F.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT]),
    ],
)
def test_fields_a_board_lacks(mixed, index, unsupported):
    for v in pynvml.nvmlDeviceGetFieldValues(handle(index), unsupported):
        assert v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED, v.fieldId


def test_t4_reports_retired_pages_by_field(mixed):
    got = read(
        handle(3),
        [F.NVML_FI_DEV_RETIRED_SBE, F.NVML_FI_DEV_RETIRED_DBE, F.NVML_FI_DEV_RETIRED_PENDING],
    )
    assert [v.nvmlReturn for v in got.values()] == [0, 0, 0]


def test_nvlink_scope_is_link_or_all(mixed):
    tx = F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    got = read(handle(0), [(tx, 0), (tx, 17), (tx, 0xFFFFFFFF), (tx, 18)])
    assert got[(tx, 0)].value.ullVal == got[(tx, 17)].value.ullVal
    assert got[(tx, 0xFFFFFFFF)].value.ullVal == pytest.approx(
        18 * got[(tx, 0)].value.ullVal, rel=1e-6
    )
    assert got[(tx, 18)].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_counters_are_monotonic(mixed, clock):
    h = handle(0)
    previous = [v.value.ullVal for v in pynvml.nvmlDeviceGetFieldValues(h, COUNTERS)]
    for _ in range(40):
        clock.advance(7.3)
        now = [v.value.ullVal for v in pynvml.nvmlDeviceGetFieldValues(h, COUNTERS)]
        assert all(b >= a for a, b in zip(previous, now, strict=True)), (previous, now)
        previous = now
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == previous[0]


def test_energy_integrates_power(mixed, clock):
    h = handle(2)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    watts = []
    for _ in range(100):
        watts.append(pynvml.nvmlDeviceGetPowerUsage(h))
        clock.advance(0.1)
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == pytest.approx(sum(watts) * 0.1, rel=0.01)  # mW * s = mJ
    avg = read(h, [F.NVML_FI_DEV_POWER_AVERAGE])[(F.NVML_FI_DEV_POWER_AVERAGE, 0)].value.uiVal
    assert avg == pytest.approx(watts[-1], rel=0.05)


def test_field_values_on_mig_handle_not_supported(default):
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(6), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFieldValues(mig, [F.NVML_FI_DEV_POWER_INSTANT])
