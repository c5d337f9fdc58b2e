"""XID counts on the simulated driver outlive GPU loss and MIG reconfiguration."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.derive.xids import XidCounter
from exporter.sim import Fault, ManualClock
from tests.support.exposition import Stages, find

CATALOG = load(default_metrics_file())
MIXED = "exporter/sim/fleets/mixed.yaml"  # GPU 1: A100 with MIG instances at GI 2, 4, 7, 8
XID = "DCGM_EXP_XID_ERRORS_TOTAL"


@pytest.fixture
def node():
    clock = ManualClock()
    driver = sim.install(MIXED, clock=clock)
    col = Collector(CATALOG, "node-a")
    builder = Stages()

    def cycle() -> str:
        clock.advance(1.0)
        builder.publish(col.collect(), CATALOG)
        return builder.text

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


def test_counts_survive_gpu_loss(node):
    driver, col, cycle = node
    cycle()
    driver.inject(Fault("xid", gpu=1, gi=2, xid=95))
    driver.inject(Fault("xid", gpu=1, xid=48))
    arrive(col, 2)
    driver.inject(Fault("lost", gpu=1))
    text = cycle()
    assert not find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1")  # the GPU is gone...
    assert counts(text) == {("1", "2", "95"): 1, ("1", None, "48"): 1}  # ...its XIDs are not


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


def test_an_xid_counted_after_its_instance_is_gone(node):
    """An XID raised as its MIG instance is destroyed reaches the counters after the
    cycle that already saw the new layout (the event thread was a moment late): it is
    counted on that instance's identity and labels, not moved to the whole GPU."""
    driver, col, _ = node
    counter = XidCounter()
    driver.advance(1.0)
    before = col.collect()
    assert counter.update(before) == []  # GPU instance 7 present, nothing counted
    driver.inject(Fault("xid", gpu=1, gi=7, xid=43))
    arrive(col, 1)
    raised = col.xid.state()
    driver.inject(Fault("mig_reconfigure", gpu=1, mig=[{"profile": "7g.40gb"}]))
    driver.advance(1.0)
    after = col.collect()
    assert not any(d.gi == 7 for d in after.entities)
    assert counter.update(replace(after, xid=before.xid)) == []  # the event not in yet
    late = counter.update(replace(after, xid=raised))
    labels = [dict(s.device.labels) for s in late]
    assert [(lb["gpu"], lb.get("GPU_I_ID"), lb.get("GPU_I_PROFILE")) for lb in labels] == [
        ("1", "7", "1g.5gb")
    ]
    assert [(s.xid, s.count) for s in late] == [(43, 1)]
