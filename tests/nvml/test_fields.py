"""nvmlDeviceGetFieldValues answers unpacked in one go read as pynvml's union reads them."""

from __future__ import annotations

import dataclasses

import pynvml as N
import pytest

from exporter.nvml import reader
from exporter.nvml.fields import FIELDS
from tests.sim.handles import handle
from tests.support.simnode import node

INTEGER = FIELDS["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
FLOAT = dataclasses.replace(INTEGER, integer=False)  # a double is read as dVal only here

CASES = [  # (valueType, union member, value written)
    (N.NVML_VALUE_TYPE_DOUBLE, "dVal", 312.457),
    (N.NVML_VALUE_TYPE_DOUBLE, "dVal", -0.0),
    (N.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 2**32 - 1),
    (N.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**63 + 5),
    (N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**64 - 1),
    (N.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**40)),
    (N.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", 7),
    (N.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -3),
    (N.NVML_VALUE_TYPE_SIGNED_INT, "siVal", 2**30 + 5),  # positive: only bit 31 is the sign
    (N.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", 2**62 + 5),
    (N.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535),
    (99, "ullVal", 42),  # a value type pynvml does not know: read as ullVal
]


@pytest.mark.parametrize("integer", [True, False])
def test_each_value_type_reads_as_its_union_member(integer: bool):
    ids = [(100 + i, 0) for i in range(len(CASES))]
    req = reader._Request(ids)
    values = req.reset()
    for i, (kind, member, v) in enumerate(CASES):
        e = values[i]
        e.timestamp, e.valueType, e.nvmlReturn = 1000 + i, kind, N.NVML_SUCCESS
        setattr(e.value, member, v)
    values[3].nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
    field = INTEGER if integer else FLOAT
    answer = reader._Answer(req)
    for i, entry in enumerate(values):
        got = answer.next(field.integer)
        want = (100 + i, 1000 + i, entry.nvmlReturn, reader._value(entry, field))
        assert got == want and type(got[3]) is type(want[3]), (CASES[i], got, want)
        assert repr(got[3]) == repr(want[3])  # -0.0 stays -0.0


# nvmlBrandType_t (nvml.h) and the string DCGM gives each (DcgmCacheManager.cpp 10441-10496)
BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server", 10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA vGaming", 12: "Quadro RTX", 13: "NVIDIA RTX", 14: "NVIDIA",
    15: "GeForce RTX", 16: "Titan RTX",
}  # fmt: skip


def test_brands_are_named_as_dcgm_names_them():
    """NVML-REVIEW N14: DCGM's brand strings; a number NVML adds later reads Unknown."""
    pick = FIELDS["DCGM_FI_DEV_BRAND"].pick
    assert pick is not None
    assert {b: pick(b) for b in BRANDS} == BRANDS
    assert [pick(b) for b in (-1, 17, 99)] == ["Unknown"] * 3


def test_a_driver_without_the_newer_calls_is_read_through_the_older_ones():
    """R470 predates nvmlDeviceGetMemoryInfo_v2 (R510), nvmlDeviceGetCurrentClocksEventReasons
    (R535) and nvmlDeviceGetTemperatureV (R570): their fields are served from the older
    calls, as the driver answers those."""
    gpu = {"model": "NVIDIA A100-SXM4-80GB", "load": {"util": 50}}
    with node({"driver_version": "470.256.02", "gpus": [gpu]}) as n:
        N.nvmlInit()  # the test's own reading, beside the collector's
        h = handle(0)
        mem = N.nvmlDeviceGetMemoryInfo(h)  # nvmlMemory_t: total, free, used in bytes
        want = {
            "DCGM_FI_DEV_FB_TOTAL": mem.total >> 20,
            "DCGM_FI_DEV_FB_FREE": mem.free >> 20,
            "DCGM_FI_DEV_FB_USED": mem.used >> 20,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": N.nvmlDeviceGetCurrentClocksThrottleReasons(h),
            "DCGM_FI_DEV_GPU_TEMP": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        }
        got = n.gpu(n.cycle(1.0), 0)
    assert {name: got.get(name) for name in want} == want
