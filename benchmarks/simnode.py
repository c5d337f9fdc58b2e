"""The exporter's collector and poller in this process, on a simulated node.

The setup the in-process benchmarks share: the simulated driver installed from a fleet
file, the shipped metrics file, a ``Collector`` and a ``Poller`` as the exporter builds
them. On a manual clock (the default) sim time moves only by :meth:`SimNode.cycle`, one
second a cycle, so GPM always has a previous sample and nothing sleeps; the collector's
timestamps start at ``EPOCH``. Without it the driver and collector run in real time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from exporter import sim
from exporter.catalog.groups import resolve
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Collection, default_metrics_file
from exporter.poller import Poller
from exporter.snapshot import Snapshot

EPOCH = 1.8e9  # unix time the collector's clock starts at (any fixed value)


class SimNode:
    """A simulated ``fleet`` (None: the default node) and the exporter's collector and
    poller on it; a context manager that closes both and uninstalls the driver.

    ``latency``: override the fleet's latency model; ``collections``: the metrics file's
    collections read at their own interval; ``interval_s`` and ``timeout_s``: the
    poller's; other keywords go to ``Collector``.
    """

    def __init__(
        self,
        fleet: str | Path | None,
        *,
        manual: bool = True,
        latency: bool | None = None,
        collections: tuple[Collection, ...] = (),
        interval_s: float = 1.0,
        timeout_s: float = 10.0,
        **collector: Any,
    ) -> None:
        self.clock = sim.ManualClock()
        self.driver = sim.install(fleet, clock=self.clock if manual else None, latency=latency)
        self.catalog = load(default_metrics_file())
        if manual:
            collector.setdefault("clock", lambda: EPOCH + self.clock())
        groups = resolve(self.catalog, collections)
        self.collector = Collector(self.catalog, "bench-node", groups=groups, **collector)
        self.poller = Poller(self.catalog, self.collector, interval_s, timeout_s)

    def cycle(self) -> Snapshot:
        """One collection, one simulated second after the last (manual clock)."""
        self.clock.advance(1.0)
        return self.collector.collect()

    def timed_cycle(self) -> tuple[float, float, float]:
        """A cycle as the worker runs it, collect then publish: (collect CPU s, collect
        wall s, publish CPU s), the shape ``benchmarks.accounting.measure`` takes."""
        self.clock.advance(1.0)
        c0, w0 = time.process_time(), time.perf_counter()
        snap = self.collector.collect()
        c1, w1 = time.process_time(), time.perf_counter()
        self.poller.publish(snap)
        return c1 - c0, w1 - w0, time.process_time() - c1

    def close(self, xid_grace_s: float | None = None) -> None:
        """Stop the collector (``xid_grace_s``: see ``Collector.close``) and the poller,
        then uninstall the driver."""
        try:
            self.collector.close(xid_grace_s)
            self.poller.close()
        finally:
            sim.uninstall()

    def __enter__(self) -> SimNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
