"""What the state file keeps of the counters, and how a new process takes them back.

The ledger's holders (their totals, activity energy included, and when they ended),
each GPU's unallocated, unattributed (by allocation and by activity), unknown and down
totals with the time and energy counter its last
interval was charged to, the holders dropped, the clock-event totals and the XID totals
(DCGM_EXP_XID_ERRORS_TOTAL, by device identity, XID and the pod charged). A restored
GPU's first interval, from that time to the new process's first cycle, is down time.
Everything is checked before anything is taken back (statefile.py's rules): a file of
the wrong shape changes nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from exporter.derive.accounting.ledger import GpuTotals, HolderTotals, Ledger
from exporter.derive.accounting.statefile import Unusable, items, number, text
from exporter.derive.clocktotals import ClockEventTotals
from exporter.derive.xids import Ident, XidCounter
from exporter.frame import Holder, Owner


def dump(ledger: Ledger, clocks: ClockEventTotals, xids: XidCounter) -> dict[str, Any]:
    """The state to write (JSON-ready)."""
    holders = [
        [
            *h.key,
            _pairs(h.device_labels),
            h.allocated,
            h.busy,
            h.idle,
            h.energy,
            h.ended_at,
            h.activity_energy,
        ]
        for h in ledger.holders.values()
    ]
    gpus = []
    for g in ledger.gpus.values():
        since, energy = ledger.charged_to(g.key)
        unknown = [[r, v[0], v[1]] for r, v in sorted(g.unknown.items())]
        totals = [g.unallocated, g.unattributed, g.down, g.down_energy]
        gpus.append([g.key, _pairs(g.labels), *totals, unknown, since, energy, g.activity_rest])
    return {
        "holders": holders,
        "gpus": gpus,
        "dropped": [[r, n] for r, n in sorted(ledger.dropped.items())],
        "clock_events": [[u, r, n] for (u, r), n in sorted(clocks.counts().items())],
        "xids": [[*at, xid, _holder_row(h), n] for at, xid, h, n in xids.rows()],
    }


def restore(
    state: dict[str, Any], ledger: Ledger, clocks: ClockEventTotals, xids: XidCounter
) -> int:
    """Take the counters of ``state`` back into ``ledger``, ``clocks`` and ``xids`` (all
    fresh); the holders restored. Raises Unusable, changing nothing, when a part has the
    wrong shape."""
    holders = [_holder(h, i) for i, h in enumerate(items(state.get("holders"), "holders"))]
    gpus = [_gpu(g, i) for i, g in enumerate(items(state.get("gpus"), "gpus"))]
    dropped = Counter(
        {
            text(r[0], "dropped"): int(number(r[1], "dropped"))
            for r in _rows(state.get("dropped"), "dropped", 2)
        }
    )
    counts = Counter(
        {
            (text(r[0], "clock_events"), text(r[1], "clock_events")): int(
                number(r[2], "clock_events")
            )
            for r in _rows(state.get("clock_events"), "clock_events", 3)
        }
    )
    xid_rows = [_xid(r, i) for i, r in enumerate(items(state.get("xids"), "xids"))]
    holders = holders[: ledger.max_holders]
    ledger.holders = {h.key: h for h in holders}
    ledger.gpus = {g.key: g for g, _ in gpus}
    ledger.resume({g.key: since for g, since in gpus if since is not None})
    ledger.dropped = dropped
    clocks.restore(counts)
    xids.restore(xid_rows)
    return len(holders)


def _holder_row(h: Holder | None) -> list[Any] | None:
    if h is None:
        return None
    o = h.owner
    pairs = [list(p) for p in h.labels]
    dra = [o.driver, o.pool, o.device, o.mig_profile, o.mig_uuid]
    names = [o.namespace, o.pod, o.container, o.claim, o.claim_namespace]
    return [*names, h.pod_uid, pairs, h.vgpu, dra]


def _xid(row: Any, i: int) -> tuple[Ident, int, Holder | None, int]:
    where = f"xids[{i}]"
    if not isinstance(row, list) or len(row) != 6:
        raise Unusable(f"{where} is not a list of 6")
    gi, ci = (None if v is None else int(number(v, where)) for v in row[1:3])
    at: Ident = (text(row[0], where), gi, ci)
    h = row[4]
    holder = None
    if h is not None:
        # 8 items before the DRA device's names (driver, pool, device, MIG profile, UUID)
        if not isinstance(h, list) or len(h) not in (8, 9):
            raise Unusable(f"{where} holder is not a list of 8 or 9")
        names = [text(v, where) for v in (*h[:6], h[7])]
        dra = [text(v, where) for v in items(h[8], where)][:5] if len(h) == 9 else []
        owner = Owner(*names[:5], *dra)
        holder = Holder(owner, names[5], _labels(h[6], where), names[6])
    return at, int(number(row[3], where)), holder, int(number(row[5], where))


def _pairs(labels: tuple[tuple[str, str], ...]) -> list[list[str]]:
    return [list(p) for p in labels]


def _rows(value: Any, where: str, width: int) -> list[list[Any]]:
    rows = items(value, where)
    for r in rows:
        if not isinstance(r, list) or len(r) != width:
            raise Unusable(f"{where}: an entry is not a list of {width}")
    return rows


def _labels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    return tuple((text(p[0], where), text(p[1], where)) for p in _rows(value, f"{where} labels", 2))


def _optional(value: Any, where: str) -> float | None:
    return None if value is None else number(value, where)


def _holder(row: Any, i: int) -> HolderTotals:
    where = f"holders[{i}]"
    if not isinstance(row, list) or len(row) not in (10, 11):  # 10: before activity energy
        raise Unusable(f"{where} is not a list of 11")
    key = (text(row[0], where), text(row[1], where), text(row[2], where), text(row[3], where))
    h = HolderTotals(key, _labels(row[4], where))
    h.allocated, h.busy, h.idle, h.energy = (number(v, where) for v in row[5:9])
    h.ended_at = _optional(row[9], where)
    if len(row) == 11:
        h.activity_energy = number(row[10], where)
    return h


def _gpu(row: Any, i: int) -> tuple[GpuTotals, tuple[float, float | None] | None]:
    where = f"gpus[{i}]"
    if not isinstance(row, list) or len(row) not in (9, 10):  # 9: before activity energy
        raise Unusable(f"{where} is not a list of 10")
    g = GpuTotals(text(row[0], where), _labels(row[1], where))
    g.unallocated, g.unattributed, g.down, g.down_energy = (number(v, where) for v in row[2:6])
    g.unknown = {
        text(r[0], where): [number(r[1], where), number(r[2], where)]
        for r in _rows(row[6], f"{where} unknown", 3)
    }
    since = _optional(row[7], where)
    if len(row) == 10:
        g.activity_rest = number(row[9], where)
    return g, None if since is None else (since, _optional(row[8], where))
