"""NVLink fabric fields (DCGM 170-175) through the collector, real pynvml and the simulator.

Expected values come from nvml.h's constants (through pynvml) and from DCGM's own
mapping (DcgmCacheManager ReadFabricManagerStatusField, dcgmFabricManagerStatus_t,
dcgm_structs.h return codes), not from the exporter's tables.
"""

from __future__ import annotations

import logging

import pynvml as N
import pytest

from exporter import sim
from exporter.catalog.metricsfile import parse
from exporter.collector import Collector
from exporter.nvml.fabric import manager_status
from exporter.sim import FLEETS_DIR, Fault
from exporter.sim.clock import ManualClock
from tests.support.exposition import Stages

FIELDS = (
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
    "DCGM_FI_DEV_FABRIC_MANAGER_ERROR",
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID",
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
)
CATALOG = parse("".join(f"{f}, gauge, x\n" for f in FIELDS) + "DCGM_FI_DEV_GPU_TEMP, gauge, t\n")
# dcgmFabricManagerStatus_t (dcgm_structs.h)
NOT_STARTED, IN_PROGRESS, SUCCESS, FAILURE = 1, 2, 3, 4
DCGM_ST_TIMEOUT = -11
H100 = "NVIDIA H100 80GB HBM3"


if not hasattr(N, "c_nvmlGpuFabricInfo_v3_t"):  # the lowest nvidia-ml-py .ci/run also tests
    pytest.skip(
        "this nvidia-ml-py has no nvmlGpuFabricInfo_v3_t or health-mask constants to check "
        "the fabric against (the exporter declares its own structures); the newest one runs it",
        allow_module_level=True,
    )


def mask(**conditions: int) -> int:
    """A health mask built with nvml.h's shifts: NAME=value."""
    shift = "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_"
    return sum(v << getattr(N, shift + k) for k, v in conditions.items())


HEALTHY_GB200 = mask(
    DEGRADED_BW=N.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE,
    ROUTE_RECOVERY=N.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE,
    ROUTE_UNHEALTHY=N.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE,
    ACCESS_TIMEOUT_RECOVERY=N.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE,
    INCORRECT_CONFIGURATION=N.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE,
    PARTITION_ASSIGNED=N.NVML_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE,
    GFM_STATE=N.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED,
)


@pytest.fixture
def start():
    made = []

    def _start(fleet):
        clock = ManualClock()
        driver = sim.install(fleet, clock=clock)
        col = Collector(CATALOG, "n", clock=lambda: 1_700_000_000 + clock())
        made.append(col)
        return driver, col

    yield _start
    for col in made:
        col.close()
    sim.uninstall()


def fabric(snap) -> dict[int, dict[str, int]]:
    return {
        g.index: {k: v for k, v in snap.values[g.key].items() if "FABRIC" in k} for g in snap.gpus
    }


def test_gb200_tray_registered_and_stuck_gpus(start):
    _, col = start(FLEETS_DIR / "gb200.yaml")
    got = fabric(col.collect())
    done = {
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": SUCCESS,
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR": 0,
        "DCGM_FI_DEV_FABRIC_CLIQUE_ID": 32766,
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK": HEALTHY_GB200,
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY": N.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
    }
    assert got[0] == got[1] == got[2] == done
    # never finished: no error code before completion (DCGM leaves it blank)
    assert got[3]["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == IN_PROGRESS
    assert "DCGM_FI_DEV_FABRIC_MANAGER_ERROR" not in got[3]
    assert got[3]["DCGM_FI_DEV_FABRIC_CLIQUE_ID"] == 0
    b = Stages()
    b.publish(col.collect(), CATALOG)
    assert '\nDCGM_FI_DEV_FABRIC_MANAGER_STATUS{gpu="3",' in b.text


def test_faults_change_health_and_registration(start):
    driver, col = start(FLEETS_DIR / "gb200.yaml")
    col.collect()
    driver.inject(Fault("fabric", gpu=1, fabric={"health": {"route_unhealthy": True}}))
    driver.inject(Fault("fabric", gpu=3, fabric={"state": "completed", "status": "TIMEOUT"}))
    driver.inject(Fault("fabric", gpu=2, fabric={"state": "not_started"}))
    got = fabric(col.collect())
    shift = N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    assert (got[1]["DCGM_FI_DEV_FABRIC_HEALTH_MASK"] >> shift) & 3 == (
        N.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    )
    assert got[1]["DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"] == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    assert got[3]["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == FAILURE
    assert got[3]["DCGM_FI_DEV_FABRIC_MANAGER_ERROR"] == DCGM_ST_TIMEOUT
    assert got[2]["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == NOT_STARTED


def test_the_older_error_name_serves_the_same_code():
    """DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE, field 171's older name, in a metrics file:
    the same DCGM return code as its current name."""
    both = "".join(f"DCGM_FI_DEV_FABRIC_MANAGER_{n}, gauge, e\n" for n in ("ERROR", "ERROR_CODE"))
    clock = ManualClock()
    driver = sim.install(FLEETS_DIR / "gb200.yaml", clock=clock)
    col = Collector(parse(both), "n", clock=lambda: 1_700_000_000 + clock())
    try:
        driver.inject(Fault("fabric", gpu=3, fabric={"state": "completed", "status": "TIMEOUT"}))
        got = fabric(col.collect())
    finally:
        col.close()
        sim.uninstall()
    assert got[3] == {
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR": DCGM_ST_TIMEOUT,
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE": DCGM_ST_TIMEOUT,
    }
    assert got[0]["DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"] == 0


def test_r570_driver_has_a_mask_and_no_summary(start):
    _, col = start(FLEETS_DIR / "h200.yaml")
    for _ in range(2):
        got = fabric(col.collect())
    assert all(g["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == SUCCESS for g in got.values())
    assert all("DCGM_FI_DEV_FABRIC_HEALTH_MASK" in g for g in got.values())
    assert not any("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY" in g for g in got.values())
    # the version probe is not an error: nothing counted
    assert not [e for e in col.session.error_counts() if "Fabric" in e[0]]


def test_driver_before_r550_reads_the_unversioned_call(start):
    fleet = {
        "driver_version": "535.183.01",
        "missing_functions": ["nvmlDeviceGetGpuFabricInfoV"],
        "gpus": [{"model": H100}, {"model": H100}],
    }
    _, col = start(fleet)
    col.collect()
    got = fabric(col.collect())
    assert got[0] == {
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": SUCCESS,
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR": 0,
        "DCGM_FI_DEV_FABRIC_CLIQUE_ID": 0,
    }


def test_gpus_without_a_fabric_have_no_series_and_are_asked_once(start, caplog):
    caplog.set_level(logging.DEBUG)
    _, col = start(FLEETS_DIR / "a100-80gb-535.yaml")
    for _ in range(3):
        snap = col.collect()
    assert not any(fabric(snap).values())
    errors = {(f, c): n for f, c, n in col.session.error_counts()}
    gpus = len(snap.gpus)
    assert errors[("nvmlDeviceGetGpuFabricInfoV", "FUNCTION_NOT_FOUND")] == gpus
    assert errors[("nvmlDeviceGetGpuFabricInfo", "NOT_SUPPORTED")] == gpus
    logged = [r for r in caplog.records if "FABRIC_MANAGER_STATUS not available" in r.message]
    assert len(logged) == 1


def test_an_unknown_state_is_dcgms_badparam():
    """NVML-REVIEW N11: DCGM publishes DCGM_ST_BADPARAM (-1) for a state it does not know
    (DcgmCacheManager.cpp 8094-8098, dcgm_structs.h:347), not a status of its own."""
    assert [manager_status(s, 0) for s in (0, 1, 2)] == [0, 1, 2]
    assert manager_status(3, 0) == 3 and manager_status(3, 1) == 4
    assert manager_status(4, 0) == manager_status(7, 0) == -1
