"""XID counts per device and code (DCGM_EXP_XID_ERRORS_TOTAL).

Counts are keyed by structured identity: the GPU's UUID and, for a MIG
instance, its GPU-instance and compute-instance ids (plus the pod holding the
device, with pod labels on), never by label text. A count therefore never
resets when a label changes, and it outlives driver reloads, a lost GPU and
MIG reconfiguration for as long as the process runs: a series whose device is
gone keeps the labels it had when it was last seen.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from exporter.frame import Holder, XidSeries
from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

Ident = tuple[str, int | None, int | None]  # GPU UUID, GPU-instance id, compute-instance id
GONE_KEEP = 5
"""Updates a device that went without an XID is still known for: the event thread may
count an XID raised as a MIG instance was destroyed after the cycle that saw it gone."""


def ident(dev: Device) -> Ident:
    """Structured identity of a GPU or MIG instance (MIG: parent UUID, GI, CI)."""
    return (dev.uuid, dev.gi, dev.ci) if dev.is_mig else (dev.uuid, None, None)


class XidCounter:
    """Turns the event thread's cumulative counts into counter series.

    With pod labels, an XID is charged to the container holding the device in
    the cycle it is seen, so a new pod on the GPU does not inherit old XIDs; a
    former holder's series goes only when another container holds the device.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int | None, int | None, int], int] = {}
        self._acc: dict[tuple[Ident, int, Hashable | None], int] = {}
        self._holders: dict[tuple[Ident, Hashable | None], Hashable | None] = {}
        self._where: dict[Ident, Device] = {}  # present devices, and last seen of counted ones
        self._gone: dict[Ident, int] = {}  # uncounted devices gone: updates since last seen
        # counts a process before this one kept (the state file), taken at the next update
        # for the devices present then
        self._restored: list[tuple[Ident, int, Holder | None, int]] = []

    def update(
        self, snap: Snapshot, holders: Mapping[str, Hashable] | None = None
    ) -> list[XidSeries]:
        """Add the events counted since the last call; the series, ordered by device key."""
        holders = holders or {}
        present: dict[Ident, Device] = {}
        for d in snap.gpus + snap.down + snap.entities:
            present[ident(d)] = d
        self._where.update(present)
        if self._restored:
            self._take_restored(present)
        by_gi: dict[tuple[str, int | None], Ident] = {
            (i[0], i[1]): i for i in self._where if i[1] is not None
        }
        for uuid, gi, ci, xid, n in snap.xid.counts:
            at: Ident = (uuid, gi, ci)  # the compute instance the event names, when it names one
            if at not in self._where:
                at = by_gi.get((uuid, gi)) or (uuid, None, None)
            if at not in self._where:
                continue
            prev = self._seen.get((uuid, gi, ci, xid), 0)
            self._seen[(uuid, gi, ci, xid)] = n
            delta = n - prev if n >= prev else n  # a smaller total: the watcher started over
            if delta > 0:
                h = holders.get(self._where[at].key)
                owner = getattr(h, "owner", h)
                key = (at, xid, owner)
                self._acc[key] = self._acc.get(key, 0) + delta
                self._holders[(at, owner)] = h
        self._drop_former_holders(present, holders)
        self._forget_gone(present)
        out = [
            XidSeries(self._where[at], xid, self._holders[(at, owner)], n)
            for (at, xid, owner), n in self._acc.items()
        ]
        out.sort(key=lambda s: (s.device.key, s.xid))
        return out

    def rows(self) -> list[tuple[Ident, int, Holder | None, int]]:
        """(device identity, XID, holder charged, count) of every series (the state file
        keeps them; holders that are not pod Holders are left out)."""
        out = []
        for (at, xid, owner), n in self._acc.items():
            h = self._holders.get((at, owner))
            if owner is None or isinstance(h, Holder):
                out.append((at, xid, h if isinstance(h, Holder) else None, n))
        return out

    def restore(self, rows: list[tuple[Ident, int, Holder | None, int]]) -> None:
        """Start from the counts of ``rows`` (:meth:`rows` of a process before), for the
        devices present at the next update."""
        self._restored = list(rows)

    def _take_restored(self, present: Mapping[Ident, Device]) -> None:
        for at, xid, h, n in self._restored:
            if at in present:
                owner = None if h is None else h.owner
                self._acc[(at, xid, owner)] = self._acc.get((at, xid, owner), 0) + n
                self._holders[(at, owner)] = h
        self._restored = []

    def _forget_gone(self, present: Mapping[Ident, Device]) -> None:
        """Keep present devices and counted ones; others for GONE_KEEP updates after."""
        counted = {at for at, _, _ in self._acc}
        gone = {i: self._gone.get(i, 0) + 1 for i in self._where if i not in present}
        self._gone = {i: n for i, n in gone.items() if i not in counted and n <= GONE_KEEP}
        self._where = {
            i: d for i, d in self._where.items() if i in present or i in counted or i in self._gone
        }

    def _drop_former_holders(self, present: Mapping[Ident, Device], holders: Mapping) -> None:
        """Forget series of containers whose present device another container now holds.

        A device with no holder keeps its former holder's series: the pod map has gaps
        (after a driver outage it lacks the MIG instances until the kubelet answers
        again), and a gap must not delete counts.
        """
        for at, xid, owner in list(self._acc):
            dev = present.get(at)
            if owner is None or dev is None:
                continue
            h = holders.get(dev.key)
            if h is None:
                continue
            if getattr(h, "owner", h) != owner:
                del self._acc[(at, xid, owner)]
                self._holders.pop((at, owner), None)
            else:
                self._holders[(at, owner)] = h  # same container, maybe newer labels
