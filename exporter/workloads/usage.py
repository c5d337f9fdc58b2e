"""Who held each device in a cycle, for GPU accounting: claims and unaccounted processes.

From the kubelet's map (which containers hold a device, with their replica IDs) and
the cycle's process rows (read on shared devices, on devices no one holds that have
memory in use, and, when host PIDs can be joined to pods, on ``HELD_PER_CYCLE`` of the
devices one container holds, in turn: see :func:`wants_processes`). A device whose
processes were not read this cycle keeps what its last read found while its holders
stay. A process belongs to a holder when its host PID joins to
that container; it is unaccounted when it is on a device no one holds, or when the
join says it runs in no pod, in a pod the API server no longer knows, or in a
container that does not hold the device. A process the join cannot place (no host
/proc, a pod not yet seen) is taken to be the holders'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exporter.frame import Claim, DeviceUse, Owner
from exporter.nvml.fields import MIB
from exporter.nvml.processes import ProcUse
from exporter.snapshot import Snapshot, Value
from exporter.workloads.advertised import Advertised
from exporter.workloads.capacity import Parts
from exporter.workloads.mapper import PodMap

FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB; whether a device no one holds has memory in use

# (known, owner): known False when the join cannot place the PID; owner None when the
# process belongs to no running container
Whose = Callable[[int], tuple[bool, Owner | None]]
HELD_PER_CYCLE = 4
"""Devices held by one container whose process lists a cycle reads (with the join). A
list costs two driver calls, modelled at 4.5 ms each (docs/benchmarks.md): reading all 56
instances of a MIG node every cycle would cost about half a second."""


def wants_processes(
    podmap: PodMap, join: bool, turn: int = 0, trusted: bool = True
) -> Callable[[str, Mapping[str, Value]], bool]:
    """Which devices' processes a cycle reads: shared devices always; devices no one
    holds when memory is in use on them (or its amount was not read), while the map is
    ``trusted`` (the kubelet's last answer is current: before it or while it fails, a
    device missing from the map says nothing); devices one container holds only when
    ``join`` (host PIDs can be joined to pods), and then ``HELD_PER_CYCLE`` of them, the
    ``turn``-th lot in key order."""
    owners = podmap.owners
    sole = sorted(k for k, v in owners.items() if len(v) == 1) if join else []
    lots = max(1, -(-len(sole) // HELD_PER_CYCLE))
    first = (turn % lots) * HELD_PER_CYCLE
    this_turn = frozenset(sole[first : first + HELD_PER_CYCLE])

    def wanted(key: str, values: Mapping[str, Value]) -> bool:
        held = owners.get(key)
        if held:
            return len(held) > 1 or key in this_turn
        used = values.get(FB_USED)
        return trusted and (used is None or used > 0)

    return wanted


NOBODY = DeviceUse()
_NO_ADS: Advertised = {}
_NO_PARTS: Mapping[str, Parts] = {}


class Usage:
    """Builds each cycle's uses. A device whose processes were not read keeps the same
    DeviceUse object while its holders stay (accounting then reuses what it derived from
    it): the one of its last read, with the join, else the one without processes."""

    def __init__(self) -> None:
        # device key -> (its holders, (replica IDs held, advertised), its use, whether a
        # trusted cycle may reuse it) as last built
        self._kept: dict[str, tuple[tuple[Owner, ...], Any, DeviceUse, bool]] = {}
        self._trusted = True  # whether the last cycle's map was current

    def uses(
        self,
        snap: Snapshot,
        podmap: PodMap,
        whose: Whose | None,
        trusted: bool = True,
        advertised: Advertised = _NO_ADS,
        parts: Mapping[str, Parts] = _NO_PARTS,
    ) -> dict[str, DeviceUse]:
        """Claims and unaccounted use of every device of ``snap``. ``whose`` joins a host
        PID to its container; None when processes cannot be joined (no API server).
        ``advertised``: the replica IDs advertised per device (workloads/advertised.py).
        ``parts``: the holders' parts of devices several DRA claims hold (capacity.py).
        While the map is not ``trusted`` (wants_processes), a device keeps what its last
        use found (its unaccounted processes included), and nothing new is unaccounted."""
        if not trusted:
            whose = None
        out = {}
        kept: dict[str, tuple[tuple[Owner, ...], Any, DeviceUse, bool]] = {}
        for dev in snap.entities:
            key = dev.key
            procs = snap.processes.get(key)
            holders = podmap.owners.get(key, ())
            reps = (podmap.replicas.get(key), advertised.get(key), parts.get(key))
            last = self._kept.get(key)
            if procs is not None and trusted:
                got = _use(key, podmap, procs, whose, reps[1], _used(snap, key), reps[2])
                # read in turn (one holder, with the join): kept till the next turn; the
                # others are read whenever it matters, and kept for a kubelet outage only
                kept[key] = (holders, reps, got, whose is not None and len(holders) == 1)
            elif (
                last is not None
                and last[0] == holders
                and last[1] == reps
                # the reads of a cycle are chosen before its kubelet answer: the first
                # cycle after an outage has not read what the outage did not read
                and (last[3] or not trusted or not self._trusted)
            ):
                got = last[2]
                kept[key] = last
            else:
                got = _use(key, podmap, procs if holders else None, whose, reps[1], None, reps[2])
                kept[key] = (holders, reps, got, True)
            out[key] = got
        self._kept = kept
        self._trusted = trusted
        return out


def device_uses(
    snap: Snapshot, podmap: PodMap, whose: Whose | None, advertised: Advertised = _NO_ADS
) -> dict[str, DeviceUse]:
    """Claims and unaccounted use of every device of ``snap`` (:meth:`Usage.uses` without
    reuse)."""
    return {
        d.key: _use(
            d.key,
            podmap,
            snap.processes.get(d.key),
            whose,
            advertised.get(d.key),
            _used(snap, d.key),
        )
        for d in snap.entities
    }


def _used(snap: Snapshot, key: str) -> Value | None:
    """The device's memory in use (MiB), None when not read."""
    return snap.values.get(key, {}).get(FB_USED)


def _use(
    key: str,
    podmap: PodMap,
    procs: tuple[ProcUse, ...] | None,
    whose: Whose | None,
    advertised: frozenset[str] | None = None,
    used_mib: Value | None = None,
    parts: Parts | None = None,
) -> DeviceUse:
    holders = podmap.owners.get(key, ())
    if not holders:
        if not procs:
            return NOBODY
        if used_mib is not None and any(p.used_mib is None for p in procs):
            # NVML withholds per-process memory (MIG, an unprivileged reader): no pod
            # holds the device, so all the memory in use on it is theirs
            return DeviceUse((), float(used_mib) * MIB, len(procs))
        return DeviceUse((), _bytes(procs), len(procs))
    return _held(holders, podmap.replicas.get(key, {}), procs, whose, advertised, parts)


def shares(
    holders: tuple[Owner, ...],
    reps: Mapping[Owner, tuple[str, ...]],
    advertised: frozenset[str] | None,
) -> tuple[list[float], int, str]:
    """Each holder's part of a device (0..1), the replicas they are over and the basis:
    replicas held over those advertised when every replica held is among them, else over
    the replicas all holders hold ("held"); (1 each, 0, "") on a device held without
    replicas."""
    held = [len(reps.get(o, ())) or 1 for o in holders]
    named = {r for o in holders for r in reps.get(o, ())}
    if not named:
        total = sum(held)
        return [h / total for h in held], 0, ""
    if advertised and named <= advertised:
        return [h / len(advertised) for h in held], len(advertised), "advertised"
    total = sum(held)
    return [h / total for h in held], total, "held"


def _bytes(rows: tuple[ProcUse, ...] | list[ProcUse]) -> float:
    return sum(p.used_mib or 0.0 for p in rows) * MIB


def _held(
    holders: tuple[Owner, ...],
    reps: Mapping[Owner, tuple[str, ...]],
    procs: tuple[ProcUse, ...] | None,
    whose: Whose | None,
    advertised: frozenset[str] | None = None,
    by_claim: Parts | None = None,
) -> DeviceUse:
    """A held device: each holder's share (``by_claim``: from its DRA claim's consumed
    capacity) and, where processes were joined, its SM utilization and whether it ran
    anything; the processes of no holder."""
    parts, replicas, basis = by_claim or shares(holders, reps, advertised)
    if procs is None or whose is None:
        running = None if procs is None else bool(procs)
        sole = len(holders) == 1
        return DeviceUse(
            tuple(
                Claim(o.namespace, o.pod, o.container, s, running=running if sole else None)
                for o, s in zip(holders, parts, strict=True)
            ),
            replicas=replicas,
            basis=basis,
        )
    sm = dict.fromkeys(holders, 0.0)
    count = dict.fromkeys(holders, 0)
    strays: list[ProcUse] = []
    stray_sm = 0.0
    placed = 0
    for p in procs:
        known, owner = whose(p.pid)
        if owner in sm:
            assert owner is not None
            sm[owner] += p.sm_util or 0.0
            count[owner] += 1
            placed += 1
        elif known:
            strays.append(p)
            stray_sm += p.sm_util or 0.0
    # On a device where no process could be placed at all (host PIDs not visible), say
    # nothing per holder rather than call every holder idle.
    joined = placed > 0 or not procs or len(strays) == len(procs)
    shared = len(holders) > 1
    claims = tuple(
        Claim(
            o.namespace,
            o.pod,
            o.container,
            s,
            sm[o] if (joined and shared) else None,
            count[o] > 0 if joined else None,
        )
        for o, s in zip(holders, parts, strict=True)
    )
    return DeviceUse(
        claims, _bytes(strays), len(strays), stray_sm if shared else 0.0, replicas, basis
    )
