"""Pods and process lifetimes in a fleet file, and the GPU instance profiles NVML lists."""

from __future__ import annotations

import re

import pynvml
import pytest

from exporter.sim import FLEETS_DIR, FleetError, load_fleet
from exporter.sim.fleet import Fleet
from tests.sim.handles import handle, mig_handles

ACCOUNTING = FLEETS_DIR / "accounting.yaml"
H100 = "NVIDIA H100 80GB HBM3"


def names(pods: list[dict]) -> list[str]:
    return [p["name"] for p in pods]


def test_pods_run_from_start_to_end_with_the_devices_current_ids(install, clock) -> None:
    driver = install(ACCOUNTING)
    gpu1, gpu3 = driver.gpus[1], driver.gpus[3]
    assert names(driver.pods()) == ["train", "ts-a", "ts-b", "leaky"]
    clock.advance(10.5)  # "small" starts at 10.5: a pod is running from its start
    pods = {p["name"]: p for p in driver.pods()}
    assert "small" in pods
    (device,) = pods["small"]["containers"][0]["devices"]
    assert device == {"resource_name": "nvidia.com/gpu", "device_ids": [gpu3.mig_by_gi(7).uuid]}
    assert pods["ts-b"]["containers"][0]["devices"][0]["device_ids"] == [f"{gpu1.uuid}::1"]
    assert "leaky" not in names(driver.pods(150.4))  # ... and stopped from its end
    assert names(driver.pods(610.4)).count("small") == 1
    assert "small" not in names(driver.pods(610.5))


def test_processes_are_listed_while_they_run(install, clock) -> None:
    install(ACCOUNTING)
    listed = lambda i: [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(i))]  # noqa: E731
    assert listed(1) == [50101, 50102] and listed(4) == []
    used = pynvml.nvmlDeviceGetMemoryInfo(handle(4), version=pynvml.nvmlMemory_v2).used
    assert used == 0
    clock.advance(300.25)
    assert listed(1) == [50101, 50103] and listed(4) == [50401]
    used = pynvml.nvmlDeviceGetMemoryInfo(handle(4), version=pynvml.nvmlMemory_v2).used
    assert used >> 20 == 8192  # and some 4 KiB pages more (exporter/sim/devices.py in_use)
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle(1), 0)
    assert sorted(s.pid for s in samples) == [50101, 50103]
    (small,) = [h for h in mig_handles(handle(3)) if pynvml.nvmlDeviceGetGpuInstanceId(h) == 7]
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(small)] == [50301]
    clock.advance(400)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(small)] == []


@pytest.mark.parametrize(
    ("pod", "error"),
    [
        (
            {"name": "p", "devices": ["gpu:9"]},
            "pods[0].devices[0]: 'gpu:9': the node has GPUs 0 to 0",
        ),
        ({"name": "p", "devices": ["nvidia0"]}, "is not a device reference; use gpu:N, gpu:N::R"),
        ({"name": "p", "devices": ["mig:0:7"]}, "GPU 0 has no MIG device with GPU instance id 7"),
        ({"name": "p", "devices": ["gpu:0"], "start": 10, "end": 5}, "pods[0].end: 5 is below"),
        ({"devices": ["gpu:0"]}, "pods[0]: missing required key 'name'"),
    ],
)
def test_a_bad_pod_is_one_error_naming_it(pod: dict, error: str) -> None:
    with pytest.raises(FleetError, match=re.escape(error)):
        Fleet.from_dict({"gpus": [{"model": H100}], "pods": [pod]}, "node.yaml")


def test_a_mig_gpu_is_named_by_its_instances() -> None:
    fleet = {
        "gpus": [{"model": H100, "mig": [{"profile": "1g.10gb"}]}],
        "pods": [{"name": "p", "devices": ["gpu:0"]}],
    }
    with pytest.raises(FleetError, match="is in MIG mode; name a MIG device"):
        Fleet.from_dict(fleet, "node.yaml")


def test_a_process_cannot_end_before_it_starts() -> None:
    fleet = {"gpus": [{"model": H100, "processes": [{"pid": 1, "start": 9, "end": 2}]}]}
    with pytest.raises(FleetError, match=r"gpus\[0\].processes\[0\].end: 2 is below"):
        Fleet.from_dict(fleet, "node.yaml")


def test_the_shipped_accounting_fleet_loads() -> None:
    fleet = load_fleet(ACCOUNTING)
    assert len(fleet.gpus) == 6 and len(fleet.pods) == 21


def test_gpu_instance_profiles_list_the_gpus_slices(mixed) -> None:
    """The A100 lists its GPU instance profiles, up to the whole GPU's 7 compute slices;
    the L4, which has no MIG, lists none."""
    a100 = handle(1)
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
        a100, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    )
    assert (info.sliceCount, info.memorySizeMB) == (7, 40192)
    one = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (one.sliceCount, one.id) == (1, 19)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(2), 0)
