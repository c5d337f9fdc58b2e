"""Shared fixtures of the attribution tests: the default node's devices, and a fake
kubelet serving its pods (a test file may serve other pods under the same name)."""

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods


@pytest.fixture(scope="session")
def inventory():
    """(GPUs by index, MIG instances by (index, GI)) of one cycle on the default node."""
    sim.install(None)
    col = Collector(load(default_metrics_file()), "n")
    try:
        snap = col.collect()
    finally:
        col.close()
        sim.uninstall()
    gpus = {d.index: d for d in snap.gpus}
    migs = {(d.index, d.gi): d for d in snap.entities if d.is_mig}
    return gpus, migs


@pytest.fixture
def kubelet(tmp_path):
    """A fake kubelet serving the default node's pods, on a socket of its own."""
    k = FakeKubelet(tmp_path / "kubelet.sock", load_pods("default-node.yaml", fleet_ids(None)))
    k.start()
    yield k
    k.close()
