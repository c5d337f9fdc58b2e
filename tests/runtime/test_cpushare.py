"""The worker thread offers its core between the steps of a cycle (exporter/runtime/cpushare.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.runtime import cpushare
from exporter.sim.clock import ManualClock
from tests.support.exposition import Stages

MIG56 = Path(__file__).parents[2] / "exporter" / "sim" / "fleets" / "h100x8-mig56.yaml"


def _yields(monkeypatch: pytest.MonkeyPatch, step: float) -> list[float]:
    """Each sched_yield made, at the time of a clock that moves ``step`` s per read."""
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    seen: list[float] = []
    monkeypatch.setattr(cpushare, "_clock", clock)
    monkeypatch.setattr(cpushare, "_yield", lambda: seen.append(now[0]))
    monkeypatch.setattr(cpushare, "_next", 0.0)
    return seen


def test_one_yield_per_interval_of_work(monkeypatch: pytest.MonkeyPatch) -> None:
    yields = _yields(monkeypatch, 10e-6)
    for _ in range(1000):  # 10 ms of the clock
        cpushare.offer()
    assert len(yields) == pytest.approx(10e-3 / cpushare.EVERY_S, abs=1)
    gaps = [b - a for a, b in itertools.pairwise(yields)]
    assert min(gaps) >= cpushare.EVERY_S - 1e-9


def test_a_cycle_offers_the_core_while_reading_and_while_rendering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both halves of a cycle on 8 GPUs with 56 MIG instances, each milliseconds of the
    worker's CPU: before every NVML call, and before every family of the render (a
    clock that moves a whole interval per read, so every offer yields)."""
    yields = _yields(monkeypatch, cpushare.EVERY_S)
    catalog = load(default_metrics_file())
    clock = ManualClock()
    sim.install(MIG56, clock=clock, latency=False)
    col = Collector(catalog, "node-a", clock=lambda: 1_700_000_000 + clock())
    try:
        snap = col.collect()
        reading = len(yields)
        Stages().publish(snap, catalog)
        rendering = len(yields) - reading
    finally:
        col.close()
        sim.uninstall()
    assert reading >= 300  # about 385 NVML calls a cycle on this node
    assert rendering == len(catalog.metrics)
