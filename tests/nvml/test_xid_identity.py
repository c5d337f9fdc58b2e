"""XID counts on the simulated driver outlive driver reloads, GPU loss and MIG reconfiguration."""

from __future__ import annotations

import time

import pytest

from exporter import sim
from exporter.catalog import load
from exporter.collector import Collector
from exporter.config import default_metrics_file
from exporter.exposition.build import Builder
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.sim import Fault, ManualClock
from tests.exposition import find

CATALOG = load(default_metrics_file())
MIXED = "exporter/sim/fleets/mixed.yaml"  # GPU 1: A100 with MIG instances at GI 2, 4, 7, 8
XID = "DCGM_EXP_XID_ERRORS_TOTAL"


@pytest.fixture
def node():
    clock = ManualClock()
    driver = sim.install(MIXED, clock=clock)
    col = Collector(CATALOG, "node-a")
    builder = Builder(SelfMetrics(1.0))

    def cycle() -> str:
        clock.advance(1.0)
        builder.dcgm(col.collect(), CATALOG)
        return builder.dcgm_text

    try:
        yield driver, col, cycle
    finally:
        col.close()
        sim.uninstall()


def arrive(col: Collector, total: int) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if col.xid is not None and sum(n for *_, n in col.xid.state().counts) >= total:
            return
        time.sleep(0.02)
    raise AssertionError("XIDs did not arrive")


def counts(text: str) -> dict[tuple[str, str | None, str], float]:
    return {
        (s.labels["gpu"], s.labels.get("GPU_I_ID"), s.labels["xid"]): s.value
        for s in find(text, XID)
    }


def test_counts_survive_a_driver_reload(node):
    driver, col, cycle = node
    cycle()
    driver.inject(Fault("xid", gpu=1, gi=4, xid=31, count=2))
    driver.inject(Fault("xid", gpu=0, xid=13))
    arrive(col, 3)
    want = {("1", "4", "31"): 2, ("0", None, "13"): 1}
    assert counts(cycle()) == want
    driver.inject(Fault("driver_unloaded", duration=1.5))
    assert counts(cycle()) == want  # NVML gone: counts stay
    for _ in range(5):
        text = cycle()
    assert col.session.up
    assert counts(text) == want


def test_counts_survive_gpu_loss(node):
    driver, col, cycle = node
    cycle()
    driver.inject(Fault("xid", gpu=1, gi=2, xid=79))
    driver.inject(Fault("xid", gpu=1, xid=79))
    arrive(col, 2)
    driver.inject(Fault("lost", gpu=1))
    text = cycle()
    assert not find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1")  # the GPU is gone...
    assert counts(text) == {("1", "2", "79"): 1, ("1", None, "79"): 1}  # ...its XIDs are not


def test_counts_survive_mig_reconfiguration(node):
    driver, col, cycle = node
    cycle()
    driver.inject(Fault("xid", gpu=1, gi=7, xid=43))
    arrive(col, 1)
    assert counts(cycle()) == {("1", "7", "43"): 1}
    driver.inject(Fault("mig_reconfigure", gpu=1, mig=[{"profile": "7g.40gb"}]))
    text = cycle()
    assert [s.labels["GPU_I_PROFILE"] for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="1")] == [
        "7g.40gb"
    ]
    old = find(text, XID, gpu="1")
    assert [(s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"], s.value) for s in old] == [
        ("7", "1g.5gb", 1)
    ]


@pytest.mark.parametrize("xid_first", [True, False])
def test_an_xid_on_an_instance_destroyed_in_the_same_instant(node, xid_first):
    """The XID names GPU instance 7, which a reconfiguration at the same sim time
    destroys (either order): it is counted on that instance's identity all the same."""
    driver, col, cycle = node
    cycle()
    xid = Fault("xid", gpu=1, gi=7, xid=43, at=1.5)
    reconf = Fault("mig_reconfigure", gpu=1, mig=[{"profile": "7g.40gb"}], at=1.5)
    for f in (xid, reconf) if xid_first else (reconf, xid):
        driver.inject(f)
    cycle()  # sim time 2: both happened
    arrive(col, 1)
    text = cycle()
    old = find(text, XID, gpu="1")
    assert [(s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"], s.value) for s in old] == [
        ("7", "1g.5gb", 1)
    ]
