"""A simulated node and a collector on it, cycle by cycle on a manual clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from exporter import sim
from exporter.catalog.metricsfile import Catalog
from exporter.collector import Collector
from exporter.sim import ManualClock, SimDriver
from exporter.sim.models import catalog
from exporter.snapshot import Snapshot
from tests.support.catalogs import ALL_ROWS

# every row with series of its own (tests/catalogs.py): these tests read rows the
# default leaves out
CATALOG = WIDE = ALL_ROWS
H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class Node:
    driver: SimDriver
    col: Collector
    clock: ManualClock

    def cycle(self, step: float = 1.0) -> Snapshot:
        snap = self.col.collect()
        self.clock.advance(step)
        return snap

    def gpu(self, snap: Snapshot, index: int) -> dict[str, Any]:
        (dev,) = [d for d in snap.gpus if d.index == index]
        return dict(snap.values.get(dev.key, {}))


@contextmanager
def node(
    fleet: str | Path | Mapping[str, Any] | None = None,
    shared: Callable[[], frozenset[str]] | None = None,
    kernel_log: str | None = None,
    sim_log: bool = True,
    catalog: Catalog = WIDE,
) -> Iterator[Node]:
    """The fleet installed below pynvml and a collector on it; both closed afterwards.

    ``kernel_log``: the file the collector reads as its kernel log, which the simulated
    driver writes (unless ``sim_log`` is False)."""
    clock = ManualClock()
    log = kernel_log if sim_log else None
    driver = sim.install(fleet, clock=clock, latency=False, kernel_log=log)
    extra: dict[str, Any] = {} if kernel_log is None else {"kernel_log": kernel_log}
    if shared is not None:  # the devices whose process lists a cycle reads

        def wants() -> Callable[[str, Any], bool]:
            keys = shared()
            return lambda key, _values: key in keys

        extra["wants_processes"] = wants
    col = Collector(catalog, "node-a", **extra)
    try:
        yield Node(driver, col, clock)
    finally:
        col.close()
        sim.uninstall()


def until(what: str, check: Callable[[], bool], seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def blackwell(monkeypatch) -> str:
    """A board of the Blackwell architecture (the H100 entry's figures; only the
    architecture matters to these tests), in the catalog for one test; its name."""
    base = catalog()[H100]
    board = type(base)(**{**base.__dict__, "name": "Test Blackwell"})
    object.__setattr__(board, "architecture", pynvml.NVML_DEVICE_ARCH_BLACKWELL)
    monkeypatch.setattr("exporter.sim.fleet.catalog", lambda: {**catalog(), board.name: board})
    return board.name
