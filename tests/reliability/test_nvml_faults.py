"""NVML faults in-process, one cycle at a time on a ManualClock: the driver going away
with each of its error codes, and MIG reconfigured under a running cycle.

tests/nvml/test_collector.py covers the basic cases (lost GPU, DRIVER_NOT_LOADED
once, MIG reconfigured between cycles, an XID burst); these add the recovery
timing, the other error codes, stale handles and the series left behind.
"""

from __future__ import annotations

import pytest

from exporter import sim
from exporter.catalog import load
from exporter.collector import MAX_BACKOFF_S, Collector
from exporter.config import default_metrics_file
from exporter.poller import Poller
from exporter.sim.clock import ManualClock
from exporter.sim.faults import DRIVER_CODES, Fault
from tests.exposition import find

CATALOG = load(default_metrics_file())
EPOCH = 1_700_000_000


@pytest.fixture
def node():
    """(driver, poller, clock) on the default fleet (8 H100, MIG on GPUs 6 and 7)."""
    clock = ManualClock()
    driver = sim.install(None, clock=clock, latency=False)
    col = Collector(CATALOG, "node-a", slow_s=5.0, clock=lambda: EPOCH + clock())
    poller = Poller(CATALOG, col, 1.0, 10.0)
    try:
        yield driver, poller, clock
    finally:
        col.close()
        poller.close()
        sim.uninstall()


def step(poller: Poller, clock: ManualClock, seconds: float = 1.0) -> str:
    """One cycle, rendered as a scrape would see it; then time moves on."""
    snap = poller.collector.collect()
    poller.publish(snap)
    clock.advance(seconds)
    return poller.exposition.plain.decode()


def gpus_reporting(text: str) -> set[str]:
    return {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_POWER_USAGE")}


@pytest.mark.parametrize("code", DRIVER_CODES)
def test_driver_gone_and_back_recovers_without_restart(node, code):
    """Each way the driver can go away: series go (no stale values served as fresh),
    nvml_up says so, init is retried with backoff, and everything comes back."""
    driver, poller, clock = node
    col = poller.collector
    before = step(poller, clock)
    assert gpus_reporting(before) == {str(i) for i in range(8)}
    xid_before = col.xid
    driver.inject(Fault("driver_unloaded", duration=20.0, code=code))
    inits = []
    down_for = 0
    for _ in range(60):
        text = step(poller, clock)
        if poller.snapshot.ok:
            break
        down_for += 1
        assert find(text, "gpu_exporter_nvml_up")[0].value == 0
        assert not find(text, "DCGM_FI_DEV_POWER_USAGE")  # no old values passed off as new
        assert find(text, "gpu_exporter_gpus")[0].value == 0
        inits.append(sum(n for f, _, n in col.session.error_counts() if f == "nvmlInit"))
    assert poller.snapshot.ok, f"no recovery after {down_for} s"
    # back within one backoff step of the driver's return: at most 20 s + 16 s
    assert 20 <= down_for <= 20 + 16
    # backoff: 1, 2, 4, 8, 16 s between init attempts, so a handful of tries, not 20
    assert inits[-1] <= 6
    text = step(poller, clock)
    assert gpus_reporting(text) == {str(i) for i in range(8)}
    assert find(text, "gpu_exporter_nvml_up")[0].value == 1
    assert col.xid is xid_before  # same watcher, counts kept
    errors = {(f, c) for f, c, _ in col.session.error_counts()}
    assert any(c == code for _, c in errors), errors
    # the XID watcher works again on the re-initialised driver
    driver.inject(Fault("xid", gpu=3, xid=48))
    for _ in range(50):
        text = step(poller, clock, 0.1)
        if find(text, "DCGM_EXP_XID_ERRORS_TOTAL", gpu="3", xid="48"):
            break
    assert [s.value for s in find(text, "DCGM_EXP_XID_ERRORS_TOTAL", gpu="3", xid="48")] == [1]


def test_backoff_is_capped(node):
    """A driver gone for 10 minutes: init is retried at most every 30 s, and the first
    cycle after the driver is back (plus at most one backoff) recovers."""
    driver, poller, clock = node
    col = poller.collector
    step(poller, clock)
    driver.inject(Fault("driver_unloaded", duration=600.0))
    attempts = 0
    for _ in range(600 + int(MAX_BACKOFF_S) + 2):
        step(poller, clock)
        if poller.snapshot.ok:
            break
    attempts = sum(n for f, _, n in col.session.error_counts() if f == "nvmlInit")
    assert poller.snapshot.ok
    # 1+2+4+8+16 s, then every 30 s: about 24 attempts in 10 minutes, never one a cycle
    assert 15 <= attempts <= 30


def test_mig_reconfigured_during_a_cycle(node):
    """The layout changes between enumeration and reading: the cycle still completes,
    the old instances' handles fail quietly (counted), and the next cycle shows only
    the new instances, none of the old ones."""
    driver, poller, clock = node
    col = poller.collector
    text = step(poller, clock)
    old = {s.labels["GPU_I_ID"] for s in find(text, "DCGM_FI_DEV_FB_USED", gpu="6")}
    assert len(old) == 7
    real_read = col.reader.read
    fired = []

    def read(dev, scope):
        if not fired and dev.index == 0:  # GPU 0 is read before GPU 6
            one = [{"profile": "7g.80gb"}]
            fired.append(driver.inject(Fault("mig_reconfigure", gpu=6, mig=one)))
        return real_read(dev, scope)

    col.reader.read = read
    text = step(poller, clock)
    assert fired
    assert gpus_reporting(text) == {str(i) for i in range(8)}  # no GPU lost over it
    col.reader.read = real_read
    text = step(poller, clock)
    new = find(text, "DCGM_FI_DEV_FB_USED", gpu="6")
    assert [(s.labels["GPU_I_PROFILE"], s.labels["GPU_I_ID"]) for s in new] == [("7g.80gb", "0")]
    assert find(text, "gpu_exporter_mig_instances")[0].value == 1 + 4
    assert poller.snapshot.ok
    # every failure on a stale handle was counted, none was fatal; the next cycles are clean
    errors = dict(((f, c), n) for f, c, n in col.session.error_counts())
    step(poller, clock)
    assert dict(((f, c), n) for f, c, n in col.session.error_counts()) == errors
    assert not any(c in ("GPU_IS_LOST", "UNKNOWN") for _, c in errors)


def test_mig_churn_leaves_nothing_behind(node):
    """Fifty reconfigurations: the exporter's per-instance state stays at the instances
    that exist (the enumerator used to keep every instance ever seen)."""
    driver, poller, clock = node
    col = poller.collector
    layouts = ([{"profile": "1g.10gb"}] * 7, [{"profile": "3g.40gb"}, {"profile": "4g.40gb"}])
    for i in range(50):
        driver.inject(Fault("mig_reconfigure", gpu=6 + i % 2, mig=layouts[i // 2 % 2]))
        text = step(poller, clock)
    live = {d.key for d in poller.snapshot.entities if d.is_mig}
    assert set(col.enumerator._mig) == live
    assert {k for k, _ in col.gpm._state.items() if k.startswith("MIG-")} <= live
    assert {k for k in col.reader._off if k.startswith("MIG-")} <= live
    assert find(text, "gpu_exporter_mig_instances")[0].value == len(live)


async def test_a_cycle_that_raises_does_not_stop_collection(node):
    """An error nobody planned for (a bug, an odd NVML code) fails that cycle only: the
    loop lives on (a dead loop would fail /health and restart the pod) and the next
    cycle collects again."""
    _driver, poller, clock = node
    await poller.cycle()
    served = poller.exposition
    real = poller.collector.collect
    poller.collector.collect = lambda: 1 / 0
    await poller.cycle()
    assert poller.selfmetrics.collections["failure"] == 1
    dcgm = served.plain.split(b"# HELP process_")[0]  # the DCGM part comes first
    assert poller.exposition.plain.startswith(dcgm) and b"DCGM_FI_DEV_GPU_TEMP" in dcgm
    poller.collector.collect = real
    clock.advance(1.0)
    await poller.cycle()
    assert poller.selfmetrics.collections["success"] == 2


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("DRIVER_NOT_LOADED", "NVMLError_DriverNotLoaded"),
        ("LIB_RM_VERSION_MISMATCH", "NVMLError_LibRmVersionMismatch"),
        ("UNINITIALIZED", "NVMLError_Uninitialized"),
    ],
)
def test_the_simulator_fails_nvml_with_each_code(code, error):
    """The simulator's side of the tests above: the code comes through pynvml as the
    exception a real driver gives; UNINITIALIZED also needs nvmlInit again afterwards."""
    import pynvml

    clock = ManualClock()
    driver = sim.install(None, clock=clock, latency=False)
    try:
        pynvml.nvmlInit()
        driver.inject(Fault("driver_unloaded", duration=5.0, code=code))
        with pytest.raises(getattr(pynvml, error)):
            pynvml.nvmlDeviceGetCount()
        with pytest.raises(getattr(pynvml, error)):
            pynvml.nvmlInit()
        clock.advance(5.0)
        if code == "UNINITIALIZED":
            with pytest.raises(pynvml.NVMLError_Uninitialized):
                pynvml.nvmlDeviceGetCount()
            pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 8
        with pytest.raises(ValueError, match="use one of DRIVER_NOT_LOADED"):
            driver.inject(Fault("driver_unloaded", duration=1.0, code="LOST_IT"))
    finally:
        sim.uninstall()
