"""The GPU model catalog (models.yaml): what each simulated board is and can do."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import pynvml
import yaml

CATALOG_PATH = Path(__file__).with_name("models.yaml")

ARCHITECTURES = {
    "turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
BRANDS = {
    "tesla": pynvml.NVML_BRAND_TESLA,
    "nvidia": pynvml.NVML_BRAND_NVIDIA,
    "nvidia_rtx": pynvml.NVML_BRAND_NVIDIA_RTX,
}
MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile; memory in MiB, placements in memory slices."""

    name: str
    id: int
    slices: int
    memory_slices: int
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    placements: tuple[int, ...]


@dataclass(frozen=True)
class Features:
    ecc: bool
    row_remapping: bool
    page_retirement: bool
    memory_temperature: bool
    encoder: bool
    decoder: bool
    fan: bool
    gpm: bool
    pcie_error_counters: bool
    fabric: bool = False  # registers with an NVLink fabric (nvmlDeviceGetGpuFabricInfo answers)


@dataclass(frozen=True)
class GpuModel:
    """One board as NVML describes it. Memory MiB, clocks MHz, power W, temperatures C."""

    name: str
    architecture: int
    compute_capability: tuple[int, int]
    brand: int
    pci_device_id: int
    pci_subsystem_id: int
    serial_prefix: str
    vbios_version: str
    inforom_image_version: str
    memory_mib: int
    memory_reserved_mib: int
    sm_count: int
    clocks: dict[str, int]
    power: dict[str, float]
    temperature: dict[str, int]
    pcie_generation: int
    pcie_width: int
    nvlinks: int
    traffic: dict[str, float]
    features: Features
    mig_max_devices: int
    mig_profiles: tuple[MigProfile, ...]

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


def profile_name(slices: int, memory_mib: int) -> str:
    """The name NVML derives for a profile: memory rounded up to whole GiB."""
    return f"{slices}g.{math.ceil(memory_mib / 1024)}gb"


def _model(raw: dict) -> GpuModel:
    mig = raw.get("mig") or {}
    profiles = []
    for p in mig.get("profiles", []):
        prof = MigProfile(**{**p, "placements": tuple(p["placements"])})
        if profile_name(prof.slices, prof.memory_mib) != prof.name:
            raise ValueError(
                f"{CATALOG_PATH}: {raw['name']} profile {prof.name}: memory {prof.memory_mib} MiB"
                f" and {prof.slices} slices make it {profile_name(prof.slices, prof.memory_mib)}"
            )
        profiles.append(prof)
    temperature = {"mem_max": 0, "memory_offset": 0, **raw["temperature"]}
    traffic = {"nvlink_tx": 0.0, "nvlink_rx": 0.0, **raw["traffic"]}
    return GpuModel(
        name=raw["name"],
        architecture=ARCHITECTURES[raw["architecture"]],
        compute_capability=tuple(raw["compute_capability"]),
        brand=BRANDS[raw["brand"]],
        pci_device_id=raw["pci_device_id"],
        pci_subsystem_id=raw["pci_subsystem_id"],
        serial_prefix=raw["serial_prefix"],
        vbios_version=str(raw["vbios_version"]),
        inforom_image_version=str(raw["inforom_image_version"]),
        memory_mib=raw["memory_mib"],
        memory_reserved_mib=raw["memory_reserved_mib"],
        sm_count=raw["sm_count"],
        clocks=dict(raw["clocks"]),
        power=dict(raw["power"]),
        temperature=temperature,
        pcie_generation=raw["pcie"]["generation"],
        pcie_width=raw["pcie"]["width"],
        nvlinks=raw["nvlinks"],
        traffic=traffic,
        features=Features(**raw["features"]),
        mig_max_devices=mig.get("max_devices", 0),
        mig_profiles=tuple(profiles),
    )


@functools.cache
def catalog() -> dict[str, GpuModel]:
    """All models by the name NVML reports, loaded once from models.yaml."""
    with CATALOG_PATH.open() as f:
        raw = yaml.safe_load(f)
    return {m.name: m for m in map(_model, raw["models"])}
