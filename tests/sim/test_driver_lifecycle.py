"""The kernel module and the library as Linux has them: no unload while NVML holds the
module, an upgrade as evict, replace, restart, and a node with no visible GPU."""

from __future__ import annotations

import pynvml
import pytest

from exporter.sim import Fault
from tests.sim.handles import handle

NEW = "580.105.08"


def test_an_upgrade_waits_for_nvml_then_only_a_new_process_gets_the_new_driver(default, clock):
    default.inject(Fault("driver_upgrade", version=NEW, duration=30))
    # in use: nothing changes for this process, the unload was refused
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    assert default.module.refused_unloads == 1
    pynvml.nvmlShutdown()  # evicted: the last client lets go, the old module goes
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    clock.advance(30)  # the new module is loaded
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):  # this process's library is old
        pynvml.nvmlInit()
    default.restart_process()
    pynvml.nvmlInit()
    assert pynvml.nvmlSystemGetDriverVersion() == NEW
    assert pynvml.nvmlSystemGetNVMLVersion() == f"13.{NEW}"
    assert pynvml.nvmlDeviceGetName(handle(0)) == "NVIDIA H100 80GB HBM3"


def test_a_library_replaced_without_reloading_the_module(default):
    """A host package upgrade without a reboot: running processes keep working, a new one
    loads the new library against the old module."""
    default.inject(Fault("driver_upgrade", version=NEW, reload=False))
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    default.restart_process()
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()


def test_no_visible_gpu_needs_the_no_gpus_flag(install):
    install({"gpus": []}, init=False)
    with pytest.raises(pynvml.NVMLError) as err:
        pynvml.nvmlInit()
    assert err.value.value == pynvml.NVML_ERROR_GPU_NOT_FOUND
    pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
    assert pynvml.nvmlDeviceGetCount() == 0
