"""The derive stage: a cycle's snapshot and who held its devices in, a frozen Frame out.

It owns every piece of state that lives across cycles: the XID counters (xids.py),
the DCGM_EXP_* windows (windows.py), the health status's previous readings
(health.py), the clock-event totals (clocktotals.py) and GPU accounting's ledger
(accounting/ledger.py, retention included). :meth:`Derive.cycle` advances them once
per collection cycle; :meth:`Derive.again` (a collection read at its own interval)
advances nothing and hands the cycle's values again with the newer readings. The
exposition renders the Frame and keeps no state of its own but text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from exporter.catalog.metricsfile import Catalog
from exporter.derive import windows, xidcatalog
from exporter.derive.accounting import durable
from exporter.derive.accounting.ledger import DEFAULT_IDLE_BELOW, DEFAULT_RETENTION_S, Ledger
from exporter.derive.accounting.statefile import SAVE_EVERY_S, Identity, StateFile, Unusable
from exporter.derive.clocktotals import ClockEventTotals
from exporter.derive.dcgmxids import DEFAULT_DCGM
from exporter.derive.health import HealthTracker
from exporter.derive.xids import XidCounter
from exporter.frame import Derived, DeviceUse, Frame, Held, HolderKey, Window
from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)

XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"
CLOCK_WINDOW = "DCGM_EXP_CLOCK_EVENTS_COUNT"
HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"
CLOCK_TOTALS = "DCGM_EXP_CLOCK_EVENTS_TOTAL"
NOBODY = Held()  # without pod attribution, HPC jobs or containers


class Derive:
    """State across cycles, turned into one frozen :class:`Frame` per cycle.

    ``cfg`` (the Config) gives the windows of DCGM_EXP_XID_ERRORS_COUNT and
    DCGM_EXP_CLOCK_EVENTS_COUNT (``xid_window_s``, ``clock_events_window_s``: default
    300 s) and accounting's idle threshold and retention (``accounting_idle_below``,
    ``accounting_retention_s``: default 0.01 and 120 s).
    """

    def __init__(self, cfg: Any = None) -> None:
        self.xid_window, self.clock_window = windows.from_config(cfg)
        self.health = HealthTracker(getattr(getattr(cfg, "release", None), "dcgm", DEFAULT_DCGM))
        self.clock_totals = ClockEventTotals()
        self.xids = XidCounter()
        self.ledger = Ledger(
            getattr(cfg, "accounting_idle_below", DEFAULT_IDLE_BELOW),
            getattr(cfg, "accounting_retention_s", DEFAULT_RETENTION_S),
        )
        self._names: tuple[Catalog | None, frozenset[str]] = (None, frozenset())
        self.last: Frame | None = None  # the last cycle's frame
        state_dir = getattr(cfg, "accounting_state_dir", "")
        self.state = StateFile(state_dir) if state_dir else None
        self.ledger.durable = self.state is not None
        self._ident: Identity | None = None  # what the state is written with; None: not yet
        self._saved_at = float("-inf")

    def cycle(
        self,
        snap: Snapshot,
        catalog: Catalog,
        held: Held = NOBODY,
        uses: Mapping[str, DeviceUse] | None = None,
        unknown: str = "",
        driver: str = "",
        windows: Mapping[HolderKey, Window] | None = None,
    ) -> Frame:
        """Advance every counter, window and the ledger with ``snap``: the cycle's frame.

        ``held``: who held the devices (the XID counts are charged to ``held.holders``);
        ``uses`` (with pod attribution): every device's holders for GPU accounting, None
        where each device is its own holder; ``unknown``: why those holders are too old
        to be charged (the kubelet away), "" when they are current; ``windows``: when
        holders began and stopped since the last cycle. The DCGM_EXP_* data is
        derived for the families ``catalog`` enables. With a state directory, the first
        cycle restores the counters a process before kept (``driver``: the driver version
        they must have been counted under) and they are written every ``SAVE_EVERY_S``.
        """
        if self.state is not None and self._ident is None:
            self._restore(snap, driver)
        xids = tuple(self.xids.update(snap, held.holders))
        derived = self._derived(snap, self._enabled(catalog))
        self.ledger.update(snap, uses, unknown, windows)
        accounts = self.ledger.accounts(uses, snap.entities)
        self.last = Frame(snap, held, xids, derived, accounts, xid_text(snap))
        if self.state is not None and snap.taken_at - self._saved_at >= SAVE_EVERY_S:
            self._ident = self.state.identity(driver, [g.uuid for g in snap.gpus])
            self.save()
            self._saved_at = snap.taken_at
        return self.last

    def save(self) -> None:
        """Write the counters to the state directory (at SIGTERM, and every SAVE_EVERY_S
        from cycle()); nothing before the first cycle or without a directory."""
        if self.state is not None and self._ident is not None:
            self.state.save(self._ident, durable.dump(self.ledger, self.clock_totals, self.xids))

    def _restore(self, snap: Snapshot, driver: str) -> None:
        assert self.state is not None
        self._ident = self.state.identity(driver, [g.uuid for g in snap.gpus])
        state = self.state.load(self._ident)
        if state is None:
            return
        try:
            n = durable.restore(state, self.ledger, self.clock_totals, self.xids)
        except Unusable as e:
            log.warning(
                "accounting state %s is unusable (%s); counters start from 0",
                self.state.path,
                str(e)[:200],
            )
            return
        log.info("accounting state restored from %s: %d holders", self.state.path, n)

    def again(self, snap: Snapshot, held: Held = NOBODY) -> Frame:
        """The frame of a cycle's snapshot with newer values of some fields (a collection
        read at its own interval): the cycle's XID counts, windows, health and accounts,
        which count cycles, stay as they are."""
        last = self.last
        if last is None:
            return Frame(snap, held, xid_text=xid_text(snap))
        return Frame(snap, held, last.xids, last.derived, last.accounts, xid_text(snap))

    def _enabled(self, catalog: Catalog) -> frozenset[str]:
        """The DCGM field names ``catalog`` serves (kept while the catalog stays)."""
        if self._names[0] is not catalog:
            self._names = (catalog, frozenset(m.field.name for m in catalog.metrics))
        return self._names[1]

    def _derived(self, snap: Snapshot, names: frozenset[str]) -> Derived:
        """Update the windows, health and clock totals, for the families enabled."""
        xw = self.xid_window.update(snap) if XID_WINDOW in names else None
        cw = self.clock_window.update(snap) if CLOCK_WINDOW in names else None
        health = self.health.update(snap) if HEALTH in names else {}
        ct = self.clock_totals.update(snap) if CLOCK_TOTALS in names else None
        return Derived(xw, cw, health, ct)


def xid_text(snap: Snapshot) -> dict[int, str]:
    """The description (``err_msg``) of each GPU's last XID in ``snap``, and of 0 (none)."""
    return {x: xidcatalog.describe(x) for x in {0, *(x for _, x in snap.xid.last)}}
