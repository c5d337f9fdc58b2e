"""Each fault kind, from a fleet file and injected at run time."""

from __future__ import annotations

import time

import pynvml
import pytest

from exporter.sim import Fault, FleetError
from tests.sim.conftest import FIXTURES
from tests.sim.handles import handle, mig_handles


def test_lost_gpu_and_its_mig_devices(default):
    parent = handle(7)
    mig = mig_handles(parent)[0]
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(parent, pynvml.nvmlEventTypeXidCriticalError, es)
    default.inject(Fault("lost", gpu=7))
    for call in (
        lambda: pynvml.nvmlDeviceGetPowerUsage(parent),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(mig),
        lambda: pynvml.nvmlDeviceGetHandleByIndex(7),
        lambda: pynvml.nvmlEventSetWait_v2(es, 10),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetPowerUsage(handle(6)) > 0


def test_not_supported_function_and_field(default):
    h = handle(2)
    default.inject(Fault("not_supported", gpu=2, function="nvmlDeviceGetPowerUsage"))
    default.inject(Fault("not_supported", gpu=2, field=pynvml.NVML_FI_DEV_MEMORY_TEMP))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(h)
    assert pynvml.nvmlDeviceGetPowerUsage(handle(1)) > 0
    temp, energy = pynvml.nvmlDeviceGetFieldValues(h, [82, 83])
    assert temp.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS


def test_slow_blocks_without_holding_the_lock(default, clock):
    import threading

    default.inject(
        Fault("slow", gpu=0, function="nvmlDeviceGetPowerUsage", seconds=0.3, duration=10)
    )
    other = {}

    def meanwhile():
        time.sleep(0.05)
        start = time.monotonic()
        other["power"] = pynvml.nvmlDeviceGetPowerUsage(handle(1))
        other["took"] = time.monotonic() - start

    t = threading.Thread(target=meanwhile)
    t.start()
    start = time.monotonic()
    pynvml.nvmlDeviceGetPowerUsage(handle(0))
    assert time.monotonic() - start >= 0.3
    t.join()
    assert other["took"] < 0.2  # another GPU's call was not held up
    clock.advance(10)
    start = time.monotonic()
    pynvml.nvmlDeviceGetPowerUsage(handle(0))
    assert time.monotonic() - start < 0.1  # the fault's duration is over


def test_driver_unloaded_waits_for_nvml_to_let_go_then_is_back(default, clock):
    """Linux refuses to unload a module in use (rmmod: "in use"): while NVML is
    initialised nothing changes; the unload happens at the last nvmlShutdown."""
    default.inject(Fault("driver_unloaded", duration=20))
    assert pynvml.nvmlDeviceGetName(handle(0)) == "NVIDIA H100 80GB HBM3"
    assert default.module.refused_unloads == 1
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlDeviceGetCount()
    clock.advance(20)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetName(handle(0)) == "NVIDIA H100 80GB HBM3"


def test_mig_reconfigure(default):
    parent = handle(7)
    old = mig_handles(parent)
    old_uuids = {pynvml.nvmlDeviceGetUUID(m) for m in old}
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(parent, pynvml.nvmlEventMigConfigChange, es)
    default.inject(
        Fault("mig_reconfigure", gpu=7, mig=[{"profile": "4g.40gb"}, {"profile": "3g.40gb"}])
    )
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventType == pynvml.nvmlEventMigConfigChange
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMemoryInfo(old[0])
    new = mig_handles(parent)
    assert [
        (pynvml.nvmlDeviceGetName(m)[-7:], pynvml.nvmlDeviceGetGpuInstanceId(m)) for m in new
    ] == [
        ("4g.40gb", 1),
        ("3g.40gb", 2),
    ]
    assert not {pynvml.nvmlDeviceGetUUID(m) for m in new} & old_uuids
    default.inject(Fault("mig_reconfigure", gpu=7, mig=False))
    assert pynvml.nvmlDeviceGetMigMode(parent) == [0, 0]
    assert pynvml.nvmlDeviceGetUtilizationRates(parent).gpu >= 0


def test_ecc_dbe_on_ampere_and_turing(mixed):
    a100, t4 = handle(1), handle(3)
    mixed.inject(Fault("ecc_dbe", gpu=1, count=2))
    mixed.inject(Fault("ecc_dbe", gpu=3))
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(a100, uncorrected, pynvml.NVML_VOLATILE_ECC) == 2
    assert pynvml.nvmlDeviceGetTotalEccErrors(a100, uncorrected, pynvml.NVML_AGGREGATE_ECC) == 2
    _cor, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(a100)
    assert (unc, pending, failure) == (2, 1, 0)
    dbe = [v.value.ullVal for v in pynvml.nvmlDeviceGetFieldValues(a100, [4, 6])]
    assert dbe == [2, 2]
    pages = pynvml.nvmlDeviceGetRetiredPages_v2(
        t4, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    assert len(pages) == 1 and pages[0]["timestamp"] > 0
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(t4) == 1


def test_overheat(default, clock):
    h = handle(0)
    thermal = pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL
    default.inject(Fault("overheat", gpu=0, temp_c=93, duration=30))
    clock.advance(10)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 93
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert pynvml.nvmlDeviceGetFieldValues(h, [thermal])[0].value.ullVal == 10 * 10**9
    clock.advance(40)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) < 89
    assert pynvml.nvmlDeviceGetFieldValues(h, [thermal])[0].value.ullVal == 30 * 10**9


def test_faults_from_a_fleet_file(install, clock):
    install(FIXTURES / "faults.yaml")
    assert pynvml.nvmlDeviceGetPowerUsage(handle(0)) > 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(handle(1), pynvml.NVML_TEMPERATURE_GPU)
    clock.advance(5)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(handle(0))


def test_injected_faults_are_checked(default):
    with pytest.raises(FleetError, match=r"fault.gpu: no GPU 9"):
        default.inject(Fault("lost", gpu=9))
    with pytest.raises(FleetError, match=r"unknown fault kind 'melt'"):
        default.inject(Fault("melt", gpu=0))
    with pytest.raises(FleetError, match=r"fault.mig\[0\].profile: unknown profile '9g.90gb'"):
        default.inject(Fault("mig_reconfigure", gpu=6, mig=[{"profile": "9g.90gb"}]))
    with pytest.raises(FleetError, match=r"'nvmlGetPower' is not an NVML function"):
        default.inject(Fault("slow", function="nvmlGetPower", seconds=1))
