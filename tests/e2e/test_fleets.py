"""Every shipped fleet: the exporter starts, serves every GPU and MIG instance, logs no
traceback and says in one line which enabled fields some GPU cannot serve."""

from __future__ import annotations

import re

import pytest

from exporter.sim import FLEETS_DIR, load_fleet
from tests.procs import Exporter
from tests.support.catalogs import EXTENDED

FLEETS = sorted(FLEETS_DIR.glob("*.yaml"))
SUMMARY = "not available on at least one GPU"
# What each new fleet's one line must name, by what the boards and drivers lack
# (docs/compatibility.md, field-support matrix).
NAMED = {
    "a100-80gb-535.yaml": ("DEV_RETIRED_SBE", "PROF_SM_ACTIVE"),
    "l40s.yaml": ("DEV_NVLINK_BANDWIDTH_TOTAL", "DEV_MEMORY_TEMP", "PROF_GR_ENGINE_ACTIVE"),
    "h200.yaml": ("DEV_RETIRED_SBE", "DEV_GPU_UTIL"),
    "b200-mig.yaml": ("DEV_RETIRED_SBE", "DEV_GPU_UTIL", "DEV_ENC_UTIL"),
    "gb200.yaml": ("DEV_RETIRED_SBE", "DEV_ENC_UTIL"),
}


@pytest.mark.parametrize("fleet", FLEETS, ids=lambda p: p.name)
def test_exporter_serves_the_fleet(fleet):
    spec = load_fleet(fleet)
    migs = sum(len(g.mig or ()) for g in spec.gpus)
    # every row the exporter can serve, so that each driver branch's readings are asked for
    exporter = Exporter("-c", "500", "-f", str(EXTENDED), fleet=fleet)
    try:
        exporter.wait_ready(timeout=60)
        text = exporter.wait_metrics(lambda t: "DCGM_FI_DEV_GPU_TEMP{" in t, timeout=20)
        gpus = set(re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{gpu="(\d+)"', text, re.M))
        assert len(gpus) == len(spec.gpus)
        instances = re.findall(r"^DCGM_FI_DEV_FB_USED\{[^}]*GPU_I_ID=", text, re.M)
        assert len(instances) == migs
        exporter.wait_metrics(lambda t: "gpu_exporter_collections_total" in t, timeout=20)
        # every driver branch serves PCIe throughput: R555 and newer from the byte counters
        # (fields 197/198), older ones through nvmlDeviceGetPcieThroughput
        text = exporter.wait_metrics(lambda t: "DCGM_FI_DEV_PCIE_TX_THROUGHPUT{" in t, 20)
        served = set(re.findall(r'^DCGM_FI_DEV_PCIE_TX_THROUGHPUT\{gpu="(\d+)"', text, re.M))
        assert served == gpus
    finally:
        log = exporter.stop()
    assert "Traceback" not in log, log
    summary = [ln for ln in log.splitlines() if SUMMARY in ln]
    assert len(summary) == 1, log
    for name in NAMED.get(fleet.name, ()):
        assert f"DCGM_FI_{name}" in summary[0], (name, summary[0])  # named in full
