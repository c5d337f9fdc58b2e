"""The poller on the simulated driver, in process: publishing, a stuck cycle, reloads, stopping."""

from __future__ import annotations

import asyncio
import ctypes
import gzip
from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.poller import Poller
from exporter.runtime.heap import limit_arenas
from exporter.sim import Fault, ManualClock
from tests.support.exposition import find, samples

CATALOG = load(default_metrics_file())
HANG_S = 1.5  # how long the stuck NVML call blocks the worker thread (real time)
TIMEOUT_S = 0.2


@pytest.fixture
def node():
    """(driver, poller) on the default fleet without modelled latency."""
    clock = ManualClock()
    driver = sim.install(None, clock=clock, latency=False)
    col = Collector(CATALOG, "node-a", slow_s=HANG_S * 4)
    poller = Poller(CATALOG, col, interval_s=0.05, timeout_s=TIMEOUT_S)
    try:
        yield driver, poller
    finally:
        if poller._pending is not None:  # let a hung call return before the driver goes
            poller._pending.exception(timeout=HANG_S * 4)
        col.close()
        poller.close()
        sim.uninstall()


def hang(driver) -> None:
    """Make every later cycle block in NVML for HANG_S seconds."""
    driver.inject(Fault("slow", gpu=0, function="nvmlDeviceGetFieldValues", seconds=HANG_S))


def self_metric(poller: Poller, name: str, **labels: str) -> float:
    (s,) = find(poller.exposition.plain.decode(), name, **labels)
    return s.value


async def test_a_cycle_publishes_plain_and_gzip(node):
    _, poller = node
    await poller.cycle()
    # first: ready means a good cycle within 3 intervals (0.15 s here), however loaded the machine
    assert poller.readiness()[0]
    body = poller.exposition.plain
    assert gzip.decompress(poller.exposition.gzipped) == body
    temps = find(body.decode(), "DCGM_FI_DEV_GPU_TEMP")
    assert len({s.labels["UUID"] for s in temps}) == 8  # per GPU instance on MIG GPUs
    assert self_metric(poller, "gpu_exporter_collections_total", result="success") == 1


async def test_a_stuck_cycle_keeps_the_last_readings_and_is_not_doubled(node):
    driver, poller = node
    await poller.cycle()
    temps = find(poller.exposition.plain.decode(), "DCGM_FI_DEV_GPU_TEMP")
    hang(driver)
    await poller.cycle()  # returns after the timeout, the worker still inside NVML
    assert poller.busy
    assert self_metric(poller, "gpu_exporter_collections_total", result="failure") == 1
    assert find(poller.exposition.plain.decode(), "DCGM_FI_DEV_GPU_TEMP") == temps
    ready, why = poller.readiness()
    assert not ready and any("exceeded" in w and "GPU 0" in w for w in why)
    await poller.cycle()  # still busy: skipped, no second thread
    assert self_metric(poller, "gpu_exporter_collections_total", result="skipped") == 1
    assert any("has not finished" in w for w in poller.readiness()[1])


async def test_a_failing_publish_keeps_the_last_exposition(node, monkeypatch, caplog):
    """A render that raises (a value nobody planned for) is counted and logged once a
    minute; scrapes keep the last exposition; the next good cycle publishes again."""
    _, poller = node
    await poller.cycle()
    temps = find(poller.exposition.plain.decode(), "DCGM_FI_DEV_GPU_TEMP")
    good = poller.builder.render

    def bad(*args, **kwargs):
        return "\ud800".encode()

    monkeypatch.setattr(poller.builder, "render", bad)
    with caplog.at_level("ERROR", logger="exporter.poller"):
        await poller.cycle()
        await poller.cycle()
    assert find(poller.exposition.plain.decode(), "DCGM_FI_DEV_GPU_TEMP") == temps
    assert self_metric(poller, "gpu_exporter_cycle_step_failures_total", step="publish") == 2
    assert self_metric(poller, "gpu_exporter_collections_total", result="success") == 1
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "collection cycle: publish failed (Unicod"
    ]
    assert any("publish step" in w and "surrogates" in w for w in poller.readiness()[1])
    monkeypatch.setattr(poller.builder, "render", good)
    await poller.cycle()
    assert self_metric(poller, "gpu_exporter_collections_total", result="success") == 2
    assert not any("publish step" in w for w in poller.readiness()[1])


async def test_a_reloaded_catalog_applies_from_the_next_cycle(node, tmp_path: Path):
    _, poller = node
    await poller.cycle()
    small = tmp_path / "small.csv"
    small.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n")
    poller.reload(load(small))
    assert find(poller.exposition.plain.decode(), "DCGM_FI_DEV_GPU_TEMP")  # not yet
    await poller.cycle()
    names = {s.name for s in samples(poller.exposition.plain.decode())}
    dcgm = {n for n in names if n.startswith("DCGM_")}
    assert dcgm == {"DCGM_FI_DEV_POWER_USAGE"}


async def test_cancelling_run_ends_it_while_nvml_hangs(node):
    driver, poller = node
    hang(driver)
    task = asyncio.create_task(poller.run())
    for _ in range(100):
        if poller.busy:
            break
        await asyncio.sleep(0.01)
    assert poller.busy
    task.cancel()
    # well under HANG_S: the cancellation must not wait for the NVML call to return
    done, _ = await asyncio.wait((task,), timeout=HANG_S / 3)
    assert done and task.cancelled()


async def test_a_cancel_as_the_cycle_finishes_is_not_lost(node):
    """The cancellation lands in the same loop pass as the cycle's result: Python 3.11's
    wait_for around shield returned the result and dropped the cancel, so SIGTERM hung."""
    driver, poller = node
    poller.timeout_s = 5.0  # the cycle finishes in time
    driver.inject(Fault("slow", gpu=0, function="nvmlDeviceGetFieldValues", seconds=0.3))
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(poller.run())
    while poller._pending is None:
        await asyncio.sleep(0)
    poller._pending.add_done_callback(lambda _: loop.call_soon_threadsafe(task.cancel))
    done, _ = await asyncio.wait((task,), timeout=2.0)
    if not done:
        task.cancel()
    assert done and task.cancelled()


def test_malloc_arena_cap_leaves_a_users_setting_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert limit_arenas() is False  # glibc read the variable at start: it stands
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    try:
        ctypes.CDLL(None).mallopt  # noqa: B018
    except AttributeError:
        pytest.skip("no glibc mallopt here (musl or macOS): nothing to cap")
    assert limit_arenas() is True


class _Sighted:
    """Records the kubelet asks between cycles (Attribution.sight)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    async def sight(self, now: float) -> None:
        self.at.append(now)


async def test_between_cycles_the_kubelet_is_asked_every_sight_interval(node, monkeypatch):
    """At an interval longer than SIGHT_S, the wait for the next cycle asks the kubelet who
    holds what every SIGHT_S (with the collector's clock: real time here), so accounting
    sees pods shorter than the interval; at a shorter interval it is not asked between
    cycles."""
    _, poller = node
    monkeypatch.setattr("exporter.poller.SIGHT_S", 0.05)
    sighted = _Sighted()
    poller.attribution = sighted  # type: ignore[assignment]
    poller.interval_s = 1.0
    loop = asyncio.get_running_loop()
    start = loop.time()
    await poller._sleep_until(start + 0.22)
    assert loop.time() >= start + 0.22
    n = len(sighted.at)
    assert 3 <= n <= 4  # at 0.05, 0.10, 0.15 and, unless the loop ran late, 0.20
    gaps = [b - a for a, b in zip(sighted.at, sighted.at[1:], strict=False)]
    assert all(g >= 0.045 for g in gaps), gaps  # the collector's clock, every SIGHT_S
    poller.interval_s = 0.05
    await poller._sleep_until(loop.time() + 0.22)
    assert len(sighted.at) == n
