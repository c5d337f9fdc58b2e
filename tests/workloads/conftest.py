"""Shared fixtures of the attribution tests."""

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file


@pytest.fixture(scope="module")
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
