"""XID counter series follow the pod that held the GPU when the XID arrived."""

from __future__ import annotations

import time

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.derive.xids import XidCounter
from exporter.frame import Holder, Owner
from exporter.sim import Fault, ManualClock


def wait_count(col, total):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if sum(n for *_, n in col.xid.state().counts) >= total:
            return
        time.sleep(0.02)
    raise AssertionError("XIDs did not arrive")


def test_new_pod_does_not_inherit_old_xids():
    clock = ManualClock()
    driver = sim.install(None, clock=clock)
    col = Collector(load(default_metrics_file()), "n")
    try:
        snap = col.collect()
        gpu0 = next(d for d in snap.gpus if d.index == 0)
        counter = XidCounter()
        a = {gpu0.key: Holder(Owner("ns", "a", "c"))}
        b = {gpu0.key: Holder(Owner("ns", "b", "c"))}
        driver.inject(Fault("xid", gpu=0, xid=13, count=2))
        wait_count(col, 2)
        series = counter.update(col.collect(), a)
        assert [(s.xid, s.holder, s.count) for s in series] == [(13, a[gpu0.key], 2)]
        # pod a ends, pod b takes the GPU: a's series goes, b starts with nothing
        assert counter.update(col.collect(), b) == []
        driver.inject(Fault("xid", gpu=0, xid=13))
        wait_count(col, 3)
        series = counter.update(col.collect(), b)
        assert [(s.xid, s.holder, s.count) for s in series] == [(13, b[gpu0.key], 1)]
        # without pod labels the count is the device's own
        plain = XidCounter().update(col.collect())
        assert [(s.xid, s.holder, s.count) for s in plain] == [(13, None, 3)]
    finally:
        col.close()
        sim.uninstall()


def test_a_gap_in_the_pod_map_keeps_the_holders_xids():
    """A cycle whose pod map lacks a MIG instance (the kubelet not answering, a map built
    before the instance was seen) gives it no holder. Its holder's XIDs stay: only
    another container taking the device ends them."""
    clock = ManualClock()
    driver = sim.install("exporter/sim/fleets/mixed.yaml", clock=clock, latency=False)
    col = Collector(load(default_metrics_file()), "n")
    try:
        clock.advance(1.0)
        snap = col.collect()
        mig = next(d for d in snap.entities if d.is_mig and d.gi == 4)
        pod = {mig.key: Holder(Owner("ns", "train", "main"))}
        counter = XidCounter()
        driver.inject(Fault("xid", gpu=1, gi=4, xid=31, count=2))
        wait_count(col, 2)
        held = [(mig.key, 31, pod[mig.key], 2)]
        assert keyed(counter.update(col.collect(), pod)) == held
        for _ in range(4):  # the kubelet not answering: no holder
            clock.advance(1.0)
            snap = col.collect()
            assert keyed(counter.update(snap, {})) == held
        assert any(d.key == mig.key for d in snap.entities)
        assert keyed(counter.update(col.collect(), pod)) == held  # the kubelet again
    finally:
        col.close()
        sim.uninstall()


def keyed(series):
    return [(s.device.key, s.xid, s.holder, s.count) for s in series]
