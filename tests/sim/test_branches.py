"""What a driver branch and a board have, as NVIDIA's headers and drivers have it: C
functions and field ids by the NVML release that added them, the early-R535 process
struct, per-process memory on MIG, MPS clients, ECC turned off, Blackwell's NVLink
counters, GPM NaN and GPU-wide traffic on MIG instances."""

from __future__ import annotations

import ctypes
import math

import pynvml
import pytest

from exporter.sim import models
from tests.sim.handles import handle, mig_handles
from tests.support.simnode import blackwell

F = pynvml
H100 = "NVIDIA H100 80GB HBM3"
PROCS = [
    {"pid": 4101, "used_memory_mib": 20480},
    {"pid": 4102, "used_memory_mib": 16384},
    {"pid": 4103, "used_memory_mib": 8192},
]


def node(driver: str, **gpu) -> dict:
    return {"driver_version": driver, "gpus": [{"model": H100, **gpu}]}


def field(h, fid: int, scope: int = 0):
    (v,) = pynvml.nvmlDeviceGetFieldValues(h, [(fid, scope)])
    return v


def test_functions_appear_with_the_release_that_added_them(install):
    install(node("535.161.08"))
    h = handle(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # NVML 12.8 (R570)
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # NVML 12.4 (R550)
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)  # NVML 12.2 (R535)
    install(node("570.124.06"))
    assert pynvml.nvmlDeviceGetTemperatureV(handle(0), pynvml.NVML_TEMPERATURE_GPU) > 0


@pytest.mark.parametrize(
    ("driver", "known"),
    [
        ("525.147.05", {186: False, 191: False, 197: False}),
        # NVML-REVIEW N12, nvml.h history: 187-196 are NVML 12.2's (R535), 201+ 12.6's (R560)
        ("535.183.01", {186: True, 187: True, 196: True, 197: False}),
        ("550.127.08", {186: True, 191: True, 197: False, 198: False, 201: False}),
        ("555.42.06", {186: True, 197: True, 198: True, 201: False}),
        ("560.35.03", {197: True, 201: True, 219: True}),
    ],
)
def test_field_ids_a_branch_does_not_know_are_invalid_argument(install, driver, known):
    install(node(driver))
    for fid, ok in known.items():  # known: answered (or NOT_SUPPORTED on this GPU)
        invalid = field(handle(0), fid).nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
        assert invalid is not ok, fid


def test_early_r535_writes_32_byte_process_entries(install):
    """535.54.03's _v3 writes nvmlProcessDetail_v1_t entries (32 bytes) where pynvml reads
    24: the first PID is right, the rest are other fields' bytes (nvitop #75, go-nvml #75)."""
    install(node("535.54.03", processes=PROCS))
    h = handle(0)
    read_by_pynvml = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    assert read_by_pynvml[0] == 4101
    assert read_by_pynvml[1:] != [4102, 4103]
    count = ctypes.c_uint(8)
    entries = (pynvml.c_nvmlProcessDetail_v1_t * 8)()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    assert fn(h, ctypes.byref(count), entries) == pynvml.NVML_SUCCESS
    assert [(e.pid, e.usedGpuMemory >> 20) for e in entries[: count.value]] == [
        (p["pid"], p["used_memory_mib"]) for p in PROCS
    ]
    # how nvitop tells these drivers apart: this symbol without the next one
    pynvml._nvmlGetFunctionPointer("nvmlDeviceGetConfComputeMemSizeInfo")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRunningProcessDetailList")


def test_later_r535_writes_24_byte_entries_again(install):
    install(node("535.104.05", processes=PROCS))
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0))] == [
        4101,
        4102,
        4103,
    ]
    pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRunningProcessDetailList")


def test_process_memory_on_mig_is_not_available(default):
    """nvitop: "Used GPU memory is N/A ... on MIG-enabled GPUs" (NVML_VALUE_NOT_AVAILABLE,
    which pynvml turns into None), on the instance and on its parent."""
    parent = handle(6)
    procs = [p for m in mig_handles(parent) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(m)]
    assert {p.pid for p in procs} >= {42001, 42002, 42003}
    assert {p.usedGpuMemory for p in procs} == {None}
    assert {p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(parent)} == {None}
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1))[0].usedGpuMemory > 0


def test_mps_clients_are_listed_by_the_mps_call_only(install):
    procs = [
        {"pid": 5001, "used_memory_mib": 1000, "type": "mps"},
        {"pid": 5002, "used_memory_mib": 2000, "type": "mps"},
        {"pid": 5003, "used_memory_mib": 500},
    ]
    install(node("580.95.05", processes=procs))
    h = handle(0)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [5003]
    mps = pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h)
    assert [(p.pid, p.usedGpuMemory >> 20) for p in mps] == [(5001, 1000), (5002, 2000)]


def test_ecc_off_leaves_the_ecc_entries_untouched(install):
    """NVIDIA bug 2009232 (DCGM's workaround in DcgmCacheManager): with ECC disabled the
    ECC entries are left as the caller passed them, nvmlReturn 0 included."""
    install(node("580.95.05", ecc=False))
    h = handle(0)
    mode = pynvml.nvmlDeviceGetEccMode(h)
    assert mode == [pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_DISABLED]
    for fid in (F.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, F.NVML_FI_DEV_ECC_DBE_AGG_TOTAL):
        v = field(h, fid)
        assert (v.nvmlReturn, v.timestamp, v.latencyUsec, v.valueType) == (0, 0, 0, 0), fid
    assert field(h, F.NVML_FI_DEV_REMAPPED_COR).timestamp > 0  # other fields answer


def test_blackwell_counts_nvlink_errors_in_the_nvlink5_fields(install, monkeypatch):
    """nvml.h: the DL replay/recovery/CRC totals are unsupported on Blackwell and newer;
    the NVLink5 COUNT fields answer, summed over links with scopeId 0xFFFFFFFF."""
    board = blackwell(monkeypatch)
    install({"driver_version": "570.124.06", "gpus": [{"model": board}]})
    h = handle(0)
    for fid in (38, 45, 52, 59):
        assert field(h, fid).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED, fid
    recoveries = field(h, F.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, 0xFFFFFFFF)
    assert recoveries.nvmlReturn == pynvml.NVML_SUCCESS
    assert recoveries.value.ullVal == models.catalog()[H100].nvlinks  # one per link


def test_hopper_has_no_nvlink5_counters(default):
    v = field(handle(0), F.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, 0xFFFFFFFF)
    assert v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert field(handle(0), 38).nvmlReturn == pynvml.NVML_SUCCESS


def _gpm(clock, take, ids):
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    take(s1)
    clock.advance(1.0)
    take(s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics = F.NVML_GPM_METRICS_GET_VERSION, len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, metric in enumerate(ids):
        mg.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(mg)
    return {mg.metrics[i].metricId: mg.metrics[i].value for i in range(len(ids))}


def test_gpm_occupancy_of_an_idle_interval_is_nan(default, clock):
    """DcgmGpmManager blanks NaN metric values: occupancy of no active cycle."""
    idle = handle(3)
    got = _gpm(clock, lambda s: pynvml.nvmlGpmSampleGet(idle, s), [F.NVML_GPM_METRIC_SM_OCCUPANCY])
    assert math.isnan(got[F.NVML_GPM_METRIC_SM_OCCUPANCY])


def test_gpm_traffic_of_a_mig_instance_is_the_whole_gpus(default, clock):
    """PCIe and NVLink bytes are GPU-level in DCGM: an instance's sample shows the GPU's."""
    parent = handle(6)
    ids = [F.NVML_GPM_METRIC_PCIE_TX_PER_SEC, F.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC]
    whole = _gpm(clock, lambda s: pynvml.nvmlGpmSampleGet(parent, s), ids)
    for m in mig_handles(parent)[:2]:
        gi = pynvml.nvmlDeviceGetGpuInstanceId(m)
        part = _gpm(clock, lambda s, gi=gi: pynvml.nvmlGpmMigSampleGet(parent, gi, s), ids)
        for metric in ids:
            assert part[metric] == pytest.approx(whole[metric], rel=0.2), metric
