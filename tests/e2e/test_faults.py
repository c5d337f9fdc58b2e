"""Faults on a simulated node: the healthy GPUs keep reporting and /ready says what happened."""

from __future__ import annotations

import time

import pytest

from tests.procs import ROOT, Exporter, http_get, wait_until
from tests.support.exposition import find

FLEETS = ROOT / "tests" / "fixtures" / "fleets"


@pytest.fixture(scope="module")
def faulty():
    exp = Exporter("-c", "300", "--collect-timeout", "1000", fleet=FLEETS / "faults.yaml")
    try:
        exp.wait_ready()
        yield exp
    finally:
        exp.stop()


def test_faults_mid_run(faulty):
    before = faulty.metrics()
    assert {s.labels["gpu"] for s in find(before, "DCGM_FI_DEV_POWER_USAGE")} == {
        "0",
        "1",
        "2",
        "3",
    }
    # unsupported: GPU 0 has no temperature series, never a made-up value
    assert {s.labels["gpu"] for s in find(before, "DCGM_FI_DEV_GPU_TEMP")} == {"1", "2", "3"}

    # from 3 s GPU 2's power call hangs 4 s: while the worker is stuck, scrapes are
    # still answered at once from the last snapshot, and /ready says what it waits on
    def stuck():
        _, _, body = faulty.get("/ready")
        return body.decode() if "GPU 2" in body.decode() and "busy" in body.decode() else None

    print(wait_until(stuck, 15, "the worker to be stuck on GPU 2"))
    status, _, body = http_get(faulty.url + "/metrics", timeout=1.0)
    assert status == 200 and b"DCGM_FI_DEV_POWER_USAGE" in body

    # GPU 1 is lost after an XID 79; GPU 2 is set aside once its slow call returns
    def settled():
        text = faulty.metrics()
        up = {s.labels["gpu"]: s.value for s in find(text, "gpu_exporter_gpu_up")}
        return text if up.get("1") == 0 and up.get("2") == 0 else None

    text = wait_until(settled, 20, "GPU 1 lost and GPU 2 set aside")
    assert {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_POWER_USAGE")} == {"0", "3"}
    assert find(text, "gpu_exporter_gpus")[0].value == 2
    xid = find(text, "DCGM_EXP_XID_ERRORS_TOTAL", gpu="1", xid="79")
    assert [s.value for s in xid] == [1]
    _status, _, body = faulty.get("/ready")
    details = body.decode()
    assert "GPU 1" in details and "lost" in details
    assert "GPU 2" in details and "slow" in details

    # the healthy GPUs keep moving: their energy counters grow between cycles
    e1 = find(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="3")[0].value
    time.sleep(1.0)
    e2 = find(faulty.metrics(), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="3")[0].value
    assert e2 > e1
