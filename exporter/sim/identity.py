"""Identity and MIG topology: counts, handles, names, UUIDs, PCI info, MIG devices."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.devices import Device, GpuState, MigState
from exporter.sim.driverview import DriverView
from exporter.sim.session import put_string

OK = pynvml.NVML_SUCCESS
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND


def put_handle(ref: Any, dev: Device) -> int:
    """Write dev's handle (a pointer value) into the caller's c_nvmlDevice_t."""
    ctypes.memmove(ctypes.addressof(out(ref)), dev.key, len(dev.key))
    return OK


@calls.system("nvmlDeviceGetCount_v2")
def device_count(drv: DriverView, now: float, count_ref: Any) -> int:
    out(count_ref).value = len(drv.gpus)
    return OK


@calls.system("nvmlDeviceGetHandleByIndex_v2")
def handle_by_index(drv: DriverView, now: float, index: Any, device_ref: Any) -> int:
    i = value(index)
    if not 0 <= i < len(drv.gpus):
        return INVALID_ARGUMENT
    gpu = drv.gpus[i]
    if gpu.lost:
        return pynvml.NVML_ERROR_GPU_IS_LOST
    return put_handle(device_ref, gpu)


@calls.system("nvmlDeviceGetHandleByUUID")
def handle_by_uuid(drv: DriverView, now: float, uuid: Any, device_ref: Any) -> int:
    raw = value(uuid)
    if not raw:
        return INVALID_ARGUMENT
    wanted = raw.decode() if isinstance(raw, bytes) else str(raw)
    for gpu in drv.gpus:
        for dev in (gpu, *gpu.migs):
            if dev.uuid == wanted:
                return pynvml.NVML_ERROR_GPU_IS_LOST if gpu.lost else put_handle(device_ref, dev)
    return NOT_FOUND


@calls.system("nvmlDeviceGetHandleByPciBusId_v2")
def handle_by_bus_id(drv: DriverView, now: float, bus_id: Any, device_ref: Any) -> int:
    raw = value(bus_id)
    if not raw:
        return INVALID_ARGUMENT
    wanted = _normal_bus_id(raw.decode() if isinstance(raw, bytes) else str(raw))
    for gpu in drv.gpus:
        if _normal_bus_id(gpu.spec.pci_bus_id) == wanted:
            return pynvml.NVML_ERROR_GPU_IS_LOST if gpu.lost else put_handle(device_ref, gpu)
    return NOT_FOUND


def _normal_bus_id(bus_id: str) -> str:
    """'0000:18:00.0' or '00000000:18:00.0' -> '00000000:18:00.0'."""
    parts = bus_id.strip().upper().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        domain, bus, devfn = parts
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{devfn}"
    except ValueError:
        return bus_id


@calls.device("nvmlDeviceGetIndex")
def device_index(drv: DriverView, gpu: GpuState, now: float, index_ref: Any) -> int:
    out(index_ref).value = gpu.index
    return OK


@calls.device("nvmlDeviceGetMinorNumber")
def minor_number(drv: DriverView, gpu: GpuState, now: float, minor_ref: Any) -> int:
    out(minor_ref).value = gpu.index
    return OK


@calls.device("nvmlDeviceGetUUID", mig=True)
def device_uuid(drv: DriverView, dev: Device, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, dev.uuid)


@calls.device("nvmlDeviceGetName", mig=True)
def device_name(drv: DriverView, dev: Device, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, dev.name)


@calls.device("nvmlDeviceGetSerial")
def serial(drv: DriverView, gpu: GpuState, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, gpu.spec.serial)


@calls.device("nvmlDeviceGetVbiosVersion")
def vbios_version(drv: DriverView, gpu: GpuState, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, gpu.model.vbios_version)


@calls.device("nvmlDeviceGetInforomImageVersion")
def inforom_image_version(drv: DriverView, gpu: GpuState, now: float, buf: Any, size: Any) -> int:
    return put_string(buf, size, gpu.model.inforom_image_version)


@calls.device("nvmlDeviceGetPciInfo_v3")
def pci_info(drv: DriverView, gpu: GpuState, now: float, info_ref: Any) -> int:
    info = out(info_ref)
    bus_id = gpu.spec.pci_bus_id
    domain, bus, rest = bus_id.split(":")
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(rest.split(".")[0], 16)
    info.pciDeviceId = gpu.model.pci_device_id
    info.pciSubSystemId = gpu.model.pci_subsystem_id
    return OK


@calls.device("nvmlDeviceGetBrand", mig=True)
def brand(drv: DriverView, dev: Device, now: float, brand_ref: Any) -> int:
    out(brand_ref).value = dev.gpu.model.brand
    return OK


@calls.device("nvmlDeviceGetArchitecture", mig=True)
def architecture(drv: DriverView, dev: Device, now: float, arch_ref: Any) -> int:
    out(arch_ref).value = dev.gpu.model.architecture
    return OK


@calls.device("nvmlDeviceGetCudaComputeCapability", mig=True)
def compute_capability(drv: DriverView, dev: Device, now: float, major: Any, minor: Any) -> int:
    out(major).value, out(minor).value = dev.gpu.model.compute_capability
    return OK


# ---- MIG ------------------------------------------------------------------------


@calls.device("nvmlDeviceGetMigMode")
def mig_mode(drv: DriverView, gpu: GpuState, now: float, current: Any, pending: Any) -> int:
    if not gpu.model.mig_capable:
        return NOT_SUPPORTED
    out(current).value = out(pending).value = int(gpu.mig_enabled)
    return OK


@calls.device("nvmlDeviceGetMaxMigDeviceCount")
def max_mig_devices(drv: DriverView, gpu: GpuState, now: float, count_ref: Any) -> int:
    out(count_ref).value = gpu.model.mig_max_devices if gpu.mig_enabled else 0
    return OK


@calls.device("nvmlDeviceGetMigDeviceHandleByIndex")
def mig_handle_by_index(
    drv: DriverView, gpu: GpuState, now: float, index: Any, device_ref: Any
) -> int:
    if not gpu.model.mig_capable:
        return NOT_SUPPORTED
    i = value(index)
    if not gpu.mig_enabled or i >= gpu.model.mig_max_devices:
        return INVALID_ARGUMENT
    for mig in gpu.migs:
        if mig.index == i:
            return put_handle(device_ref, mig)
    return NOT_FOUND


@calls.device("nvmlDeviceIsMigDeviceHandle", mig=True)
def is_mig_handle(drv: DriverView, dev: Device, now: float, flag_ref: Any) -> int:
    out(flag_ref).value = int(dev.is_mig)
    return OK


@calls.device("nvmlDeviceGetGpuInstanceId", mig=True)
def gpu_instance_id(drv: DriverView, dev: Device, now: float, id_ref: Any) -> int:
    if not isinstance(dev, MigState):
        return NOT_SUPPORTED
    out(id_ref).value = dev.gi
    return OK


@calls.device("nvmlDeviceGetComputeInstanceId", mig=True)
def compute_instance_id(drv: DriverView, dev: Device, now: float, id_ref: Any) -> int:
    if not isinstance(dev, MigState):
        return NOT_SUPPORTED
    out(id_ref).value = dev.ci
    return OK


@calls.device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig=True)
def parent_handle(drv: DriverView, dev: Device, now: float, device_ref: Any) -> int:
    if not isinstance(dev, MigState):
        return INVALID_ARGUMENT
    return put_handle(device_ref, dev.gpu)


@calls.device("nvmlDeviceGetAttributes_v2", mig=True)
def attributes(drv: DriverView, dev: Device, now: float, attrs_ref: Any) -> int:
    if not isinstance(dev, MigState):
        return NOT_SUPPORTED
    a, p = out(attrs_ref), dev.spec.profile
    a.multiprocessorCount = p.sm
    a.sharedCopyEngineCount = p.ce
    a.sharedDecoderCount = p.dec
    a.sharedEncoderCount = p.enc
    a.sharedJpegCount = p.jpeg
    a.sharedOfaCount = p.ofa
    a.gpuInstanceSliceCount = p.slices
    a.computeInstanceSliceCount = p.slices
    a.memorySizeMB = p.memory_mib
    return OK


# NVML_GPU_INSTANCE_PROFILE_<N>_SLICE constants by compute slices (nvml.h); the variants
# (REV1, REV2, media-engine flavours) answer NOT_SUPPORTED here.
_PROFILE_BY_SLICES = {
    1: pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
}


def _profile_info(drv: DriverView, dev: Device, profile: Any, info_ref: Any) -> int:
    if not isinstance(dev, GpuState) or not dev.model.mig_capable:
        return NOT_SUPPORTED
    wanted = value(profile)
    for p in dev.model.mig_profiles:  # the first (smallest) profile of each slice count
        if _PROFILE_BY_SLICES.get(p.slices) == wanted:
            info = out(info_ref)
            info.id = p.id
            info.sliceCount = p.slices
            info.instanceCount = len(p.placements)
            info.multiprocessorCount = p.sm
            info.copyEngineCount = p.ce
            info.decoderCount = p.dec
            info.encoderCount = p.enc
            info.jpegCount = p.jpeg
            info.ofaCount = p.ofa
            info.memorySizeMB = p.memory_mib
            return OK
    if not 0 <= wanted < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
        return INVALID_ARGUMENT
    return NOT_SUPPORTED


@calls.device("nvmlDeviceGetGpuInstanceProfileInfo")
def gpu_instance_profile_info(
    drv: DriverView, dev: Device, now: float, profile: Any, info_ref: Any
) -> int:
    return _profile_info(drv, dev, profile, info_ref)


@calls.device("nvmlDeviceGetGpuInstanceProfileInfoV")
def gpu_instance_profile_info_v(
    drv: DriverView, dev: Device, now: float, profile: Any, info_ref: Any
) -> int:
    if out(info_ref).version != pynvml.nvmlGpuInstanceProfileInfo_v2:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    return _profile_info(drv, dev, profile, info_ref)


@calls.device("nvmlDeviceGetGpuInstanceById")
def gpu_instance_by_id(drv: DriverView, gpu: GpuState, now: float, gi: Any, ref: Any) -> int:
    """A GPU instance's handle: here the handle of its (first) MIG device, which
    nvmlGpuInstanceGetInfo takes."""
    if not gpu.model.mig_capable:
        return NOT_SUPPORTED
    if not gpu.mig_enabled:
        return INVALID_ARGUMENT
    found = [m for m in gpu.migs if m.gi == value(gi)]
    if not found:
        return NOT_FOUND
    return put_handle(ref, min(found, key=lambda m: m.ci))


@calls.device("nvmlGpuInstanceGetInfo", mig=True)
def gpu_instance_info(drv: DriverView, dev: Device, now: float, info_ref: Any) -> int:
    """The GPU instance's id, profile id and placement (memory slices start and size)."""
    if not isinstance(dev, MigState):
        return INVALID_ARGUMENT
    info, s = out(info_ref), dev.spec
    ctypes.memmove(
        ctypes.addressof(info) + type(info).device.offset, dev.parent.key, len(dev.parent.key)
    )
    info.id, info.profileId = s.gi, s.profile.id
    info.placement.start, info.placement.size = s.start, s.profile.memory_slices
    return OK
