"""NVML faults in-process, one cycle at a time on a ManualClock: NVML unusable in each
way it can be, and MIG reconfigured under a running cycle.

tests/test_collector.py covers the basic cases (lost GPU, an unload refused while
NVML is held, MIG reconfigured between cycles, an XID burst), tests/
test_poller_driver_upgrade.py a driver upgrade; these add the exit, stale handles and the
series left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pynvml
import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.poller import EXIT_NVML, Poller
from exporter.sim.clock import ManualClock
from exporter.sim.faults import Fault
from tests.procs import Exporter, free_port
from tests.support.exposition import find

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


@pytest.mark.parametrize("how", ["no driver", "another library", "shut down"])
def test_nvml_unusable_ends_the_loop_with_one_line_and_no_values(node, how, caplog):
    """Each way NVML is unusable as a whole: no series from that cycle on, one error line,
    and the loop ends so that the process exits (the kubelet restarts it): pynvml loads
    its library once per process, so nothing in-process could recover."""
    driver, poller, clock = node
    if how == "shut down":  # NVML shut down under the running exporter
        step(poller, clock)
        before = poller.exposition.plain
        pynvml.nvmlShutdown()
    else:  # at start: the module unloaded, or a library the module does not match
        fault = {
            "no driver": Fault("driver_unloaded", duration=600),
            "another library": Fault("driver_upgrade", version="580.105.08", reload=False),
        }[how]
        driver.inject(fault)
        driver.restart_process()
        before = poller.exposition.plain
    with caplog.at_level(logging.ERROR):
        asyncio.run(asyncio.wait_for(poller.run(), timeout=10))
    assert poller.exit_status == EXIT_NVML
    assert poller.exposition.plain == before  # nothing published from this cycle
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "NVML unusable" in errors[0], errors


def test_the_process_exits_non_zero_with_one_line(tmp_path):
    """The real process: no driver at start is one error line and exit status 3."""
    fleet = tmp_path / "no-driver.yaml"
    fleet.write_text(
        "gpus: [{model: NVIDIA H100 80GB HBM3}]\n"
        "faults: [{at: 0, kind: driver_unloaded, duration: 600}]\n"
    )
    exporter = Exporter("-c", "500", fleet=fleet)
    try:
        status = exporter.proc.wait(timeout=30)
    finally:
        output = exporter.stop()
    assert status == EXIT_NVML, output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "DRIVER_NOT_LOADED" in errors[0], output
    assert "--simulate" not in errors[0]  # simulated already: no hint to simulate


def test_no_driver_on_the_host_points_at_simulate():
    """Without --simulate on a host with no NVIDIA library (this machine), the one error
    line says how to try the exporter anyway."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "-a", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if "LIBRARY_NOT_FOUND" not in p.stderr:
        pytest.skip("this host has an NVIDIA library")
    assert p.returncode == EXIT_NVML, p.stderr
    errors = [line for line in p.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "--simulate serves a simulated node" in errors[0], p.stderr


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
