"""MIG through real pynvml calls: enumeration, ids, UUIDs, per-instance memory, what is refused."""

from __future__ import annotations

import math
import re

import pynvml
import pytest

from tests.sim.conftest import FIXTURES
from tests.sim.handles import handle, mig_handles

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def describe(m) -> tuple[str, int, int]:
    attrs = pynvml.nvmlDeviceGetAttributes_v2(m)
    profile = f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"
    return profile, pynvml.nvmlDeviceGetGpuInstanceId(m), pynvml.nvmlDeviceGetComputeInstanceId(m)


def test_mig_modes_and_counts(default):
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 0
    assert pynvml.nvmlDeviceGetMigMode(handle(6)) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(6)) == 7


def test_seven_1g_instances_get_real_gpu_instance_ids(default):
    migs = mig_handles(handle(6))
    assert [describe(m) for m in migs] == [("1g.10gb", gi, 0) for gi in range(7, 14)]
    uuids = [pynvml.nvmlDeviceGetUUID(m) for m in migs]
    assert all(MIG_UUID.match(u) for u in uuids) and len(set(uuids)) == 7
    assert pynvml.nvmlDeviceGetName(migs[0]) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


def test_mixed_layout_gaps_raise_not_found(default):
    parent = handle(7)
    migs = mig_handles(parent)
    assert [describe(m) for m in migs] == [
        ("3g.40gb", 2, 0),
        ("2g.20gb", 4, 0),
        ("1g.10gb", 7, 0),
        ("1g.10gb", 8, 0),
    ]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 5)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)


def test_explicit_indexes_leave_gaps_in_the_middle(install):
    install(FIXTURES / "mig_gaps.yaml")
    parent = handle(0)
    found = {}
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            found[i] = describe(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        except pynvml.NVMLError_NotFound:
            continue
    assert found == {0: ("4g.40gb", 1, 0), 3: ("1g.10gb", 13, 0), 6: ("2g.20gb", 5, 0)}


def test_gpu_instances_report_their_placement(default):
    """nvmlDeviceGetGpuInstanceById + nvmlGpuInstanceGetInfo: id, profile id and memory
    slices of each GPU instance of GPU 7 (3g.40gb on slices 4-7, 2g.20gb on 2-3, 1g.10gb
    on 0 and 1: NVML's binary split, exporter/sim/mig.py)."""
    parent = handle(7)
    got = []
    for gi in (2, 4, 7, 8):
        info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gi))
        got.append((info.id, info.profileId, info.placement.start, info.placement.size))
    assert got == [(2, 9, 4, 4), (4, 14, 2, 2), (7, 19, 0, 1), (8, 19, 1, 1)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(parent, 3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceById(handle(0), 1)  # MIG off


def test_parent_and_handle_kind(default):
    parent = handle(7)
    mig = mig_handles(parent)[0]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    assert bytes(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == bytes(parent)
    assert bytes(pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(mig))) == bytes(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAttributes_v2(parent)


def test_utilization_not_supported_on_mig(default):
    parent = handle(6)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetDecoderUtilization(parent)
    mig = mig_handles(parent)[0]
    for call in (
        pynvml.nvmlDeviceGetUtilizationRates,
        pynvml.nvmlDeviceGetPowerUsage,
        pynvml.nvmlDeviceGetIndex,
        pynvml.nvmlDeviceGetPciInfo,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(mig, 0)
    # the parent still reports board-level values
    assert pynvml.nvmlDeviceGetPowerUsage(parent) > 0
    assert pynvml.nvmlDeviceGetUtilizationRates(handle(0)).gpu >= 0


def test_memory_per_instance(default):
    parent = handle(7)
    totals = []
    for m in mig_handles(parent):
        mem = pynvml.nvmlDeviceGetMemoryInfo(m, version=pynvml.nvmlMemory_v2)
        attrs = pynvml.nvmlDeviceGetAttributes_v2(m)
        assert mem.total == attrs.memorySizeMB << 20
        assert mem.total == mem.used + mem.free + mem.reserved
        totals.append((mem.total >> 20, mem.used >> 20))
    # file order is placement order: the second 1g.10gb took the lower slice (GI 7)
    assert totals == [(40448, 30000), (20096, 15000), (9984, 0), (9984, 5000)]
    whole = pynvml.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2)
    assert whole.used >> 20 == 50000


def test_processes_carry_instance_ids(default):
    parent = handle(7)
    by_mig = {
        pynvml.nvmlDeviceGetGpuInstanceId(m): sorted(
            p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(m)
        )
        for m in mig_handles(parent)
    }
    assert by_mig == {2: [43001], 4: [43101, 43102], 7: [], 8: [43201]}
    rows = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert {(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in rows} == {
        (43001, 2, 0),
        (43101, 4, 0),
        (43102, 4, 0),
        (43201, 8, 0),
    }
    whole = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0))
    assert [(p.gpuInstanceId, p.computeInstanceId) for p in whole] == [(0xFFFFFFFF, 0xFFFFFFFF)]


def test_a100_layout(mixed):
    migs = mig_handles(handle(1))
    assert [describe(m) for m in migs] == [
        ("3g.20gb", 2, 0),
        ("2g.10gb", 4, 0),
        ("1g.5gb", 7, 0),
        ("1g.5gb", 8, 0),
    ]
    for non_mig in (0, 2, 3):
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(non_mig)) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle(2))
