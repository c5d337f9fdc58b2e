"""The XID counter's series: counts split by the pod a device had when each XID arrived.

Without pod labels this is the event thread's count per device and code. With
them, an XID is charged to the container that held the device at the cycle it
was seen, so a new pod on the same GPU does not inherit (and alert on) old
XIDs; series of a pod that ended go away with its other series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

Series = tuple[Device, int, str, int]  # device, xid, owner label text, count


class XidCounter:
    """Turns the event thread's cumulative counts into per-owner counter series."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int | None, int], int] = {}
        self._acc: Counter[tuple[str, int, str]] = Counter()

    def update(self, snap: Snapshot, owners: Mapping[str, str] | None = None) -> list[Series]:
        owners = owners or {}
        devices = {d.key: d for d in snap.gpus + snap.down + snap.entities}
        gpus = {d.uuid: d for d in snap.gpus + snap.down if not d.is_mig}
        mig = {(d.uuid, d.gi): d for d in snap.entities if d.is_mig}
        for uuid, gi, xid, n in snap.xid.counts:
            dev = mig.get((uuid, gi)) or gpus.get(uuid)
            if dev is None:
                continue
            delta = n - self._seen.get((uuid, gi, xid), 0)
            self._seen[(uuid, gi, xid)] = n
            if delta > 0:
                self._acc[(dev.key, xid, owners.get(dev.key, ""))] += delta
        for key, xid, owner in list(self._acc):
            gone = key not in devices or (owner and owners.get(key) != owner)
            if gone:
                del self._acc[(key, xid, owner)]
        return [
            (devices[key], xid, owner, n)
            for (key, xid, owner), n in sorted(self._acc.items(), key=lambda kv: kv[0][:2])
        ]
