"""Identity through real pynvml calls: names, memory, UUIDs, PCI, versions per model."""

from __future__ import annotations

import re

import pynvml
import pytest

from tests.sim.handles import handle

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_system_versions(mixed):
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    assert pynvml.nvmlSystemGetNVMLVersion() == "13.580.95.05"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 13000


@pytest.mark.parametrize(
    ("index", "name", "total_mib", "arch", "cc"),
    [
        (0, "NVIDIA H100 80GB HBM3", 81559, pynvml.NVML_DEVICE_ARCH_HOPPER, (9, 0)),
        (1, "NVIDIA A100-SXM4-40GB", 40960, pynvml.NVML_DEVICE_ARCH_AMPERE, (8, 0)),
        (2, "NVIDIA L4", 23034, pynvml.NVML_DEVICE_ARCH_ADA, (8, 9)),
        (3, "Tesla T4", 15360, pynvml.NVML_DEVICE_ARCH_TURING, (7, 5)),
    ],
)
def test_models(mixed, index, name, total_mib, arch, cc):
    h = handle(index)
    assert pynvml.nvmlDeviceGetName(h) == name
    assert pynvml.nvmlDeviceGetArchitecture(h) == arch
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == cc
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v1.total == v2.total == total_mib << 20
    assert v2.total == v2.reserved + v2.free + v2.used
    assert v1.used == v2.used + v2.reserved  # v1 counts the reserved memory as used
    assert pynvml.nvmlDeviceGetIndex(h) == index
    assert pynvml.nvmlDeviceGetMinorNumber(h) == index


def test_uuids_bus_ids_serials_are_distinct_and_stable(default, install):
    n = pynvml.nvmlDeviceGetCount()
    assert n == 8
    ids = [
        (
            pynvml.nvmlDeviceGetUUID(handle(i)),
            pynvml.nvmlDeviceGetPciInfo(handle(i)).busId,
            pynvml.nvmlDeviceGetSerial(handle(i)),
        )
        for i in range(n)
    ]
    for column in zip(*ids, strict=True):
        assert len(set(column)) == n
    assert all(UUID.match(u) for u, _, _ in ids)
    assert ids[0][1] == "00000000:18:00.0"
    install()  # a fresh driver for the same fleet: same identities
    assert pynvml.nvmlDeviceGetUUID(handle(3)) == ids[3][0]


def test_handles_are_stable_pointers_and_lookups_agree(default):
    a, b = handle(2), handle(2)
    assert pynvml.nvmlDeviceGetUUID(a) == pynvml.nvmlDeviceGetUUID(b)
    assert bytes(a) == bytes(b) and bytes(a) != bytes(handle(3))
    uuid = pynvml.nvmlDeviceGetUUID(a)
    assert bytes(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == bytes(a)
    assert bytes(pynvml.nvmlDeviceGetHandleByPciBusId("0000:3A:00.0")) == bytes(a)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


def test_pci_and_board_strings(mixed):
    h = handle(0)
    pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
    assert (pci.domain, pci.bus, pci.device) == (0, 0x18, 0)
    assert pci.busIdLegacy == "0000:18:00.0"
    assert pci.pciDeviceId == 0x233010DE
    assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
    assert pynvml.nvmlDeviceGetBrand(handle(3)) == pynvml.NVML_BRAND_TESLA
    assert re.match(r"^\d{2}\.\d{2}\.", pynvml.nvmlDeviceGetVbiosVersion(h))
    assert pynvml.nvmlDeviceGetInforomImageVersion(h).startswith("G")
    assert pynvml.nvmlDeviceGetSerial(h).startswith("1654")
    assert pynvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]


def test_calls_before_init_and_after_shutdown(install):
    install(init=False)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()  # reference counted, like NVML
    h = handle(0)
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetName(h)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_bad_handle_is_invalid_argument(default):
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(pynvml.c_nvmlDevice_t())


def test_error_strings_come_from_pynvml(default):
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_FOUND) == "Not Found"
