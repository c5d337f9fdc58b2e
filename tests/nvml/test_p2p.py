"""P2P status per GPU pair (DCGM_EXP_P2P_STATUS data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.nvml.p2p import P2PReader, P2PSeries, p2p_series, status_name
from exporter.sim.clock import ManualClock

MIXED = Path(__file__).parents[2] / "tests" / "fixtures" / "fleets" / "mixed.yaml"


def test_series_skip_the_gpu_itself_and_name_the_status():
    got = p2p_series({(0, 0): 0, (0, 1): 0, (1, 0): 0, (0, 2): 5, (2, 0): 5})
    assert got[0] == (P2PSeries(1, "OK", 0), P2PSeries(2, "NotSupported", 5))
    assert got[2] == (P2PSeries(0, "NotSupported", 5),)


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (1, "ChipsetNotSupported"),
        (2, "GPUNotSupported"),
        (3, "TopologyNotSupported"),
        (4, "DisabledByRegKey"),
        (6, "Unknown"),
        (42, "Unknown"),
    ],
)
def test_status_names_are_dcgm_exporters(code, name):
    assert status_name(code) == name


@pytest.fixture
def node():
    clock = ManualClock()
    sim.install(MIXED, clock=clock)
    col = Collector(load(default_metrics_file()), "n", clock=lambda: 1_700_000_000 + clock())
    col.gpm.sleep = clock.advance
    try:
        yield col
    finally:
        col.close()
        sim.uninstall()


def test_nvlink_gpus_are_ok_and_pcie_only_gpus_are_not_supported(node):
    snap = node.collect()
    reader = P2PReader(node.session)
    got = reader.read(snap.gpus)
    models = {g.index: g.model for g in snap.gpus}
    assert sorted(got) == sorted(models)
    for i, series in got.items():
        assert len(series) == len(models) - 1 and i not in {s.peer_gpu for s in series}
    status = {(i, s.peer_gpu): s.link_status for i, ss in got.items() for s in ss}
    assert status[(0, 1)] == "OK"  # two H100 SXM with NVLink
    assert models[3] == "NVIDIA L4" and status[(0, 3)] == status[(3, 0)] == "NotSupported"
    assert reader.read(snap.gpus) is got  # asked once per set of GPUs
