"""After XID 119 (GSP timeout) the driver is not called for that GPU again until the
exporter restarts, as DCGM's cache manager stops (NVML-REVIEW N5: DcgmCacheManager.cpp,
ReadEnvForFatalXids' default {119} and m_skipDriverCalls, "Hostengine restart required")."""

from __future__ import annotations

import logging

from exporter.exposition.selfmetrics import SelfMetrics
from exporter.sim import Fault
from tests.support.exposition import find
from tests.support.simnode import node, until

HANG_S = 5.0  # what each field read of the timed-out GPU would block for


def test_after_xid_119_the_gpu_is_not_called_again(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="exporter.nvml.xid.fatal")
    with node(kernel_log=str(tmp_path / "kmsg")) as n:
        n.cycle()
        gpu = n.driver.gpus[2]
        n.driver.inject(Fault("xid", gpu=2, xid=119))
        until("XID 119", lambda: any(x == 119 for *_, x, _n in n.col.xid.state().counts))
        n.cycle()  # the cycle that sees it: the GPU is set aside from the next one on
        # a GPU whose GSP timed out: every call would block until the RPC timeout
        n.driver.inject(Fault("slow", gpu=2, function="nvmlDeviceGetFieldValues", seconds=HANG_S))
        for _ in range(3):
            snap = n.cycle()
            assert snap.duration < HANG_S / 2  # the GPU was not called
            assert [d.uuid for d in snap.down] == [gpu.uuid]
            assert gpu.uuid not in {d.uuid for d in snap.gpus}
            assert any("until the exporter restarts: XID 119" in p for p in snap.problems)
        lines = [r for r in caplog.records if "no more driver calls" in r.getMessage()]
        assert len(lines) == 1 and gpu.uuid in lines[0].getMessage()
        metrics = SelfMetrics(1.0)
        metrics.snapshot = snap
        stopped = find(metrics.render().decode(), "gpu_exporter_gpu_driver_calls_stopped")
        assert {s.labels["gpu"]: s.value for s in stopped} == {
            str(i): float(i == 2) for i in range(len(n.driver.gpus))
        }


def test_other_xids_leave_the_gpu_read(tmp_path):
    with node(kernel_log=str(tmp_path / "kmsg")) as n:
        n.cycle()
        n.driver.inject(Fault("xid", gpu=2, xid=120))
        n.driver.inject(Fault("xid", gpu=2, xid=79))
        until("XIDs 120, 79", lambda: len(n.col.xid.state().counts) == 2)
        n.cycle()
        snap = n.cycle()
        assert not snap.stopped and n.driver.gpus[2].uuid in {d.uuid for d in snap.gpus}
