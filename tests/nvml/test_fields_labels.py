"""The label fields /metrics serves on every GPU against pynvml's answers on the simulator.

dcgm-exporter's identity labels (gpu, UUID, pci_bus_id, device, modelName, Hostname) and
every label row of the metrics file, rendered through the derive and exposition stages,
are compared with what the test asks the simulated driver itself, by NVML call and in
DCGM's formats (the CUDA version as major.minor, the brand by DCGM's names), not through
exporter/nvml/fields.py's tables.
"""

from __future__ import annotations

from typing import Any

import pynvml as N
import pytest

from exporter.catalog.metricsfile import parse
from tests.nvml.test_fields import BRANDS
from tests.sim.handles import handle
from tests.support.exposition import Stages, samples
from tests.support.simnode import node

LABEL_ROWS = (
    "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
    "DCGM_FI_DRIVER_VERSION, label, d\n"
    "DCGM_FI_NVML_VERSION, label, n\n"
    "DCGM_FI_CUDA_DRIVER_VERSION, label, c\n"
    "DCGM_FI_DEV_NAME, label, n\n"
    "DCGM_FI_DEV_SERIAL, label, s\n"
    "DCGM_FI_DEV_UUID, label, u\n"
    "DCGM_FI_DEV_VBIOS_VERSION, label, v\n"
    "DCGM_FI_DEV_INFOROM_IMAGE_VER, label, i\n"
    "DCGM_FI_DEV_BRAND, label, b\n"
    "DCGM_FI_DEV_MINOR_NUMBER, label, m\n"
    "DCGM_FI_DEV_PCI_BUSID, label, p\n"
)
CATALOG = parse(LABEL_ROWS, "labels.csv")


def _cuda(v: int) -> str:
    """nvmlSystemGetCudaDriverVersion's 1000 * major + 10 * minor, as DCGM prints it."""
    major, rest = divmod(v, 1000)
    return f"{major}.{rest // 10}"


def truth(i: int) -> dict[str, str]:
    """GPU ``i``'s labels, asked of pynvml."""
    h: Any = handle(i)
    minor = N.nvmlDeviceGetMinorNumber(h)
    uuid = N.nvmlDeviceGetUUID(h)
    name = N.nvmlDeviceGetName(h)
    bus = N.nvmlDeviceGetPciInfo_v3(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    return {
        "gpu": str(i),
        "UUID": uuid,
        "pci_bus_id": bus,
        "device": f"nvidia{minor}",
        "modelName": name,
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": N.nvmlSystemGetDriverVersion(),
        "DCGM_FI_NVML_VERSION": N.nvmlSystemGetNVMLVersion(),
        "DCGM_FI_CUDA_DRIVER_VERSION": _cuda(N.nvmlSystemGetCudaDriverVersion()),
        "DCGM_FI_DEV_NAME": name,
        "DCGM_FI_DEV_SERIAL": N.nvmlDeviceGetSerial(h),
        "DCGM_FI_DEV_UUID": uuid,
        "DCGM_FI_DEV_VBIOS_VERSION": N.nvmlDeviceGetVbiosVersion(h),
        "DCGM_FI_DEV_INFOROM_IMAGE_VER": N.nvmlDeviceGetInforomImageVersion(h),
        "DCGM_FI_DEV_BRAND": BRANDS.get(N.nvmlDeviceGetBrand(h), "Unknown"),
        "DCGM_FI_DEV_MINOR_NUMBER": str(minor),
        "DCGM_FI_DEV_PCI_BUSID": bus,
    }


MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID", "GPU_CI_ID")
FLEETS = [None, *(f"exporter/sim/fleets/{f}.yaml" for f in ("mixed", "h200", "a100-80gb-535"))]


@pytest.mark.parametrize("fleet", FLEETS, ids=["default", "mixed", "h200", "a100-535"])
def test_every_gpus_labels_are_what_pynvml_answers(fleet):
    with node(fleet, catalog=CATALOG) as n:
        N.nvmlInit()  # the test's own reference, beside the collector's
        want = {str(i): truth(i) for i in range(N.nvmlDeviceGetCount())}
        stages = Stages()
        stages.publish(n.cycle(1.0), CATALOG)
    served: dict[str, list[dict[str, str]]] = {}
    for s in samples(stages.text):  # a MIG GPU's series repeat per instance
        gpu = {k: v for k, v in s.labels.items() if k not in MIG_LABELS}
        served.setdefault(gpu["gpu"], []).append(gpu)
    assert served.keys() == want.keys()
    for gpu, labels in want.items():
        assert all(got == labels for got in served[gpu]), gpu
    # the fleet tells its GPUs apart by every per-device label
    for name in ("UUID", "pci_bus_id", "DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_MINOR_NUMBER"):
        assert len({labels[name] for labels in want.values()}) == len(want), name
