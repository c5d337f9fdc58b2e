"""NVLink fabric information (nvmlDeviceGetGpuFabricInfo, ...V): what each fleet's GPUs
report through pynvml's own structures, checked against nvml.h's values and layout."""

from __future__ import annotations

import ctypes
import uuid

import pynvml as N
import pytest

from exporter.sim import FLEETS_DIR, Fault, Fleet, FleetError
from tests.sim.handles import handle, mig_handles

if not hasattr(N, "c_nvmlGpuFabricInfo_v3_t"):  # the lowest nvidia-ml-py .ci/run also tests
    pytest.skip(
        "this nvidia-ml-py has no nvmlGpuFabricInfo_v3_t or health-mask constants to check "
        "the fabric against (the exporter declares its own structures); the newest one runs it",
        allow_module_level=True,
    )

GB200 = FLEETS_DIR / "gb200.yaml"


def info_v(h, cls=N.c_nvmlGpuFabricInfo_v3_t):
    info = cls()
    N.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    return info


def field(mask: int, shift: int, width: int = 3) -> int:
    """NVML_GPU_FABRIC_HEALTH_GET: the value of one condition in the health mask."""
    return (mask >> shift) & width


def test_gb200_tray_registered_gpus_and_the_one_that_never_finished(install):
    install(GB200)
    done = info_v(handle(0))
    assert done.state == N.NVML_GPU_FABRIC_STATE_COMPLETED
    assert done.status == N.NVML_SUCCESS
    assert done.cliqueId == 32766
    assert uuid.UUID(bytes=bytes(done.clusterUuid)) == uuid.UUID(
        "4f6c2a1e-8b3d-4e5f-9a7b-2c1d0e9f8a7b"
    )
    mask = done.healthMask
    for shift in ("DEGRADED_BW", "ROUTE_RECOVERY", "ROUTE_UNHEALTHY", "ACCESS_TIMEOUT_RECOVERY"):
        at = getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{shift}")
        assert field(mask, at) == getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_{shift}_FALSE"), shift
    config = field(mask, N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION, 0xF)
    assert config == N.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
    assert field(mask, N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_PARTITION_ASSIGNED) == (
        N.NVML_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE
    )
    assert field(mask, N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE) == (
        N.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED
    )
    assert done.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    stuck = info_v(handle(3))
    assert stuck.state == N.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert stuck.cliqueId == 0 and bytes(stuck.clusterUuid) == bytes(16)
    legacy = N.c_nvmlGpuFabricInfo_t()
    N.nvmlDeviceGetGpuFabricInfo(handle(3), ctypes.byref(legacy))
    assert legacy.state == N.NVML_GPU_FABRIC_STATE_IN_PROGRESS


def test_struct_versions_follow_the_driver_branch(install):
    """Version 3 (health summary) from R580; an R570 driver answers version 2 only."""
    install(FLEETS_DIR / "h200.yaml")
    with pytest.raises(N.NVMLError) as err:
        info_v(handle(0))
    assert err.value.value == N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    v2 = info_v(handle(0), N.c_nvmlGpuFabricInfo_v2_t)
    assert v2.state == N.NVML_GPU_FABRIC_STATE_COMPLETED and v2.healthMask


@pytest.mark.parametrize(
    ("fleet", "gpu", "error"),
    [
        ("l40s.yaml", 0, N.NVMLError_NotSupported),  # no NVLink at all
        ("a100-80gb-535.yaml", 0, N.NVMLError_FunctionNotFound),  # R535: no ...V yet
    ],
)
def test_gpus_without_a_fabric(install, fleet, gpu, error):
    install(FLEETS_DIR / fleet)
    with pytest.raises(error):
        info_v(handle(gpu), N.c_nvmlGpuFabricInfo_v2_t)
    with pytest.raises(N.NVMLError_NotSupported):  # the call R525+ has
        N.nvmlDeviceGetGpuFabricInfo(handle(gpu), ctypes.byref(N.c_nvmlGpuFabricInfo_t()))


def test_mig_handles_have_no_fabric_of_their_own(install):
    install(FLEETS_DIR / "b200-mig.yaml")
    with pytest.raises(N.NVMLError_NotSupported):
        info_v(mig_handles(handle(4))[0])
    assert info_v(handle(4)).state == N.NVML_GPU_FABRIC_STATE_COMPLETED


def test_fabric_fault_changes_health_then_state(install):
    driver = install(GB200)
    driver.inject(Fault("fabric", gpu=1, fabric={"health": {"route_unhealthy": True}}))
    sick = info_v(handle(1))
    at = N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    assert field(sick.healthMask, at) == N.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    assert sick.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    assert sick.cliqueId == 32766  # the rest of its fabric is unchanged
    assert info_v(handle(0)).healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    driver.inject(Fault("fabric", fabric={"state": "not_started"}))  # every fabric GPU
    assert {info_v(handle(i)).state for i in range(4)} == {N.NVML_GPU_FABRIC_STATE_NOT_STARTED}


H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"gpus": [{"model": "NVIDIA L40S", "fabric": {"state": "completed"}}]},
            "node.yaml: gpus[0].fabric: NVIDIA L40S does not register with an NVLink fabric",
        ),
        (
            {"fabric": {"state": "completed"}, "gpus": [{"model": "NVIDIA L4"}]},
            "node.yaml: fabric: no GPU of this node registers with an NVLink fabric",
        ),
        (
            {"gpus": [{"model": H100, "fabric": {"state": "done"}}]},
            "node.yaml: gpus[0].fabric.state: 'done' is not one of not_supported, not_started",
        ),
        (
            {"fabric": {"health": {"route_unhealthy": "maybe"}}, "gpus": [{"model": H100}]},
            "node.yaml: fabric.health.route_unhealthy: 'maybe' is not one of true, false",
        ),
        (
            {"fabric": {"status": "FINE"}, "gpus": [{"model": H100}]},
            "node.yaml: fabric.status: 'FINE' is not an NVML return code",
        ),
        (
            {"fabric": {"cluster_uuid": "xyz"}, "gpus": [{"model": H100}]},
            "node.yaml: fabric.cluster_uuid: 'xyz' is not a UUID",
        ),
    ],
)
def test_bad_fabric_settings_name_the_path(data, message):
    with pytest.raises(FleetError) as err:
        Fleet.from_dict(data, source="node.yaml")
    assert str(err.value).startswith(message), str(err.value)


def test_fabric_fault_needs_a_fabric_gpu(install):
    driver = install(FLEETS_DIR / "mixed.yaml")  # GPU 0 is an H100, GPU 2 an L4
    with pytest.raises(FleetError, match="NVIDIA L4 does not register with an NVLink fabric"):
        driver.inject(Fault("fabric", gpu=2, fabric={"state": "in_progress"}))
    with pytest.raises(FleetError, match="fabric faults need 'fabric'"):
        driver.inject(Fault("fabric", gpu=0))
