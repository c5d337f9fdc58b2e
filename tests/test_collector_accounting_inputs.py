"""What a cycle reads for GPU accounting: MIG slices from the GPU instance profiles, the
fields accounting needs whatever the metrics file lists, and which process lists."""

from __future__ import annotations

import logging
from types import MappingProxyType

import pytest

from exporter import sim
from exporter.catalog.metricsfile import parse
from exporter.collector import Collector
from exporter.frame import Owner
from exporter.sim import FLEETS_DIR
from exporter.workloads.mapper import PodMap
from exporter.workloads.usage import wants_processes

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    sim.uninstall()


def one_cycle(fleet, csv: str = "DCGM_FI_DEV_GPU_TEMP, gauge, C.\n", **kw):
    sim.install(fleet, latency=False)
    col = Collector(parse(csv), "n", **kw)
    try:
        return col.collect()
    finally:
        col.close()


def test_mig_instances_carry_their_slices_and_their_gpus() -> None:
    snap = one_cycle(FLEETS_DIR / "mixed.yaml")
    got = sorted((d.profile, d.slices, d.gpu_slices) for d in snap.entities if d.is_mig)
    assert got and all(total == 7 for *_, total in got)
    assert {(p, s) for p, s, _ in got} >= {("3g.20gb", 3), ("1g.5gb", 1)}
    assert all(d.slices == 0 for d in snap.entities if not d.is_mig)


def test_without_the_profile_call_a_gpu_counts_seven_slices(caplog) -> None:
    fleet = {
        "missing_functions": ["nvmlDeviceGetGpuInstanceProfileInfoV"],
        "gpus": [{"model": H100, "mig": [{"profile": "3g.40gb"}]}],
    }
    with caplog.at_level(logging.INFO, logger="exporter.nvml.devices"):
        snap = one_cycle(fleet)
    (m,) = snap.entities
    assert (m.slices, m.gpu_slices) == (3, 7)
    assert "NVML lists no GPU instance profile; taking 7 compute slices" in caplog.text


def test_accounting_fields_are_read_whatever_the_metrics_file_lists() -> None:
    snap = one_cycle({"gpus": [{"model": H100, "load": {"util": 40, "swing": 0}}]})
    (g,) = snap.gpus
    values = snap.values[g.key]
    assert values["DCGM_FI_DEV_GPU_UTIL"] == 40
    assert values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] > 0
    assert "DCGM_FI_DEV_FB_USED" in values


def test_process_lists_are_read_where_accounting_needs_them() -> None:
    """GPU 0 held by one pod (no join): not read; GPU 1 shared: read; GPU 2 free with
    memory in use: read; GPU 3 free and empty: not read."""
    fleet = {
        "gpus": [
            {"model": H100, "processes": [{"pid": 10, "used_memory_mib": 100}]},
            {"model": H100, "processes": [{"pid": 11, "used_memory_mib": 100}]},
            {"model": H100, "processes": [{"pid": 12, "used_memory_mib": 100}]},
            {"model": H100},
        ]
    }
    keys = [g.uuid for g in sim.install(fleet).gpus]
    sim.uninstall()
    a, b = Owner("ns", "a", "c"), Owner("ns", "b", "c")
    pm = PodMap(MappingProxyType({keys[0]: (a,), keys[1]: (a, b)}))
    snap = one_cycle(fleet, wants_processes=lambda: wants_processes(pm, False))
    assert sorted(snap.processes) == sorted([keys[1], keys[2]])
    assert [p.pid for p in snap.processes[keys[2]]] == [12]
    joined = one_cycle(fleet, wants_processes=lambda: wants_processes(pm, True))
    assert sorted(joined.processes) == sorted(keys[:3])
