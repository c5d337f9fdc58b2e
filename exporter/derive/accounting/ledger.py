"""The accounting counters across cycles: per holder, per GPU, and the holders that ended.

Each cycle the interval since the previous one is charged with the previous cycle's
plan (plan.py): every holder's allocated, busy and idle GPU-seconds and its energy
(joules), and each GPU's unallocated GPU-seconds and unattributed energy. A GPU seen
for the first time, or again after it was down, only starts its interval. Counters
start at 0 when a holder is first seen and never go down while the process runs.

A holder that no longer holds its device keeps its final values for ``retention_s``
seconds (so that the last increments are scraped), then is dropped and counted; a
holder seen again within that time carries on. At most ``max_holders`` are kept:
past it the longest-ended go first, and a new holder is not counted at all while
that many still hold a device.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from exporter.derive.accounting.plan import GpuPlan, Planner, Share
from exporter.frame import (
    Accounts,
    DeviceUse,
    GpuAccount,
    HolderAccount,
    HolderKey,
    Unaccounted,
    Window,
)
from exporter.nvml.devices import Device
from exporter.runtime.ratelimit import RateLimitedLog
from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)

MAX_HOLDERS = 2048
"""Holders (live and ended) kept at once: 8 containers on each of the 250 pods a node may
run. Each served costs the process about 12 KiB (five series of text, rendered and gzipped
each cycle: docs/benchmarks.md), so the bound keeps 20,000 listed under the pod's limit."""
DEFAULT_RETENTION_S = 120.0
DEFAULT_IDLE_BELOW = 0.01


@dataclass(slots=True, eq=False)
class HolderTotals:
    """Totals of one holder on one device: GPU-seconds and joules."""

    key: HolderKey
    device_labels: tuple[tuple[str, str], ...]
    allocated: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    energy: float = 0.0
    activity_energy: float = 0.0  # J: idle power by allocation, power above it by activity
    ended_at: float | None = None  # unix seconds it was last seen holding; None while it holds
    ended: HolderAccount | None = None  # its frozen values once it ended (they stay)

    def account(self) -> HolderAccount:
        """The frozen values; an ended holder's are made once."""
        if self.ended is not None:
            return self.ended
        got = HolderAccount(
            self.key,
            self.device_labels,
            self.allocated,
            self.busy,
            self.idle,
            self.energy,
            self.ended_at,
            self.activity_energy,
        )
        if self.ended_at is not None:
            self.ended = got
        return got


@dataclass(slots=True, eq=False)
class GpuTotals:
    """Totals of one physical GPU's parts that no holder has."""

    key: str
    labels: tuple[tuple[str, str], ...]
    unallocated: float = 0.0  # GPU-seconds
    unattributed: float = 0.0  # joules
    ended_at: float | None = None
    # reason -> [GPU-seconds, joules] whose holders were not known (the kubelet away)
    unknown: dict[str, list[float]] = field(default_factory=dict)
    down: float = 0.0  # GPU-seconds the exporter was not running (restored state)
    down_energy: float = 0.0  # joules the GPU used meanwhile
    activity_rest: float = 0.0  # joules no holder got by the activity split
    idle_w: float | None = None  # the lowest average power of an interval seen (W)


class Ledger:
    """Owns the counters; :meth:`update` once per cycle (worker thread), then
    :meth:`accounts` for their frozen values."""

    def __init__(
        self,
        idle_below: float = DEFAULT_IDLE_BELOW,
        retention_s: float = DEFAULT_RETENTION_S,
        max_holders: int = MAX_HOLDERS,
    ) -> None:
        self.planner = Planner(idle_below)
        self.retention_s = retention_s
        self.max_holders = max_holders
        self.holders: dict[HolderKey, HolderTotals] = {}
        self.gpus: dict[str, GpuTotals] = {}
        self.dropped: Counter[str] = Counter()  # reason ("retention", "limit") -> holders
        self._plans: dict[str, GpuPlan] = {}
        self._warn = RateLimitedLog(log)
        self.durable = False  # whether the state is kept across restarts (the down family)
        # GPU key -> (unix s, energy mJ) its counters were charged to by a process before
        self._resume: dict[str, tuple[float, float | None]] = {}
        # this cycle's ended holders, the longest ended last; listed at the first eviction
        self._evictable: list[HolderTotals] | None = None
        # modelName -> the lowest average power of an interval any GPU of it drew (W)
        self._idle_by_model: dict[str, float] = {}

    def update(
        self,
        snap: Snapshot,
        uses: Mapping[str, DeviceUse] | None,
        unknown: str = "",
        windows: Mapping[HolderKey, Window] | None = None,
    ) -> None:
        """Charge the interval that ends with ``snap``; ``uses``, ``unknown`` and
        ``windows`` as plan.plans takes them. While holders are not known, none of them
        ends."""
        now = self.planner.plans(snap, uses, unknown, windows)
        live = {share[0] for plan in now.values() for share in plan.shares}
        if unknown and uses is not None:
            live = set(self.holders)
        self._end(live, set(now), snap.taken_at)  # first: an ended holder can make room
        self._evictable = None
        for plan in now.values():
            gpu = self.gpus.get(plan.key)
            if gpu is None:
                gpu = self.gpus[plan.key] = GpuTotals(plan.key, plan.labels)
            gpu.ended_at = None
            for holder, labels, *_ in plan.shares:
                self._holder(holder, labels)
            for (holder, labels, *_), _, _ in plan.passing:
                acc = self._holder(holder, labels)
                if acc is not None and acc.ended_at is None and holder not in live:
                    acc.ended_at = snap.taken_at  # it came and went: its retention starts
        for gpu_key, plan in now.items():
            last = self._plans.get(gpu_key)
            if last is not None:
                self._charge(last, plan)
            elif gpu_key in self._resume:
                self._down(gpu_key, plan)
        self._plans = now

    def accounts(self, uses: Mapping[str, DeviceUse] | None, devices: Sequence[Device]) -> Accounts:
        """The counters' values now, and the unaccounted processes of ``devices`` in ``uses``
        (None without pod attribution)."""
        return Accounts(
            tuple(acc.account() for acc in self.holders.values()),
            tuple(
                GpuAccount(
                    g.key,
                    g.labels,
                    g.unallocated,
                    g.unattributed,
                    tuple((r, v[0], v[1]) for r, v in sorted(g.unknown.items())),
                    (g.down, g.down_energy) if self.durable else None,
                    g.activity_rest,
                    g.idle_w,
                )
                for g in self.gpus.values()
            ),
            unaccounted(uses, devices),
            tuple((reason, self.dropped[reason]) for reason in ("limit", "retention")),
            replicas(uses, devices),
            tuple(self.planner.bases),
        )

    def _charge(self, last: GpuPlan, plan: GpuPlan) -> None:
        """Charge ``plan``'s GPU for the time since ``last`` with ``last``'s weights; a
        holder that stopped meanwhile up to its end, and one that began meanwhile (or came
        and went) from its start with its own weights (plan.py's windows)."""
        t0, t1 = last.taken_at, plan.taken_at
        dt = t1 - t0
        if dt <= 0:
            return
        joules = None
        if last.energy_mj is not None and plan.energy_mj is not None:
            delta = plan.energy_mj - last.energy_mj
            joules = delta / 1000.0 if delta >= 0 else None  # a reload restarts the counter
        gpu = self.gpus[last.key]
        split = (
            None if joules is None else _Split(gpu, joules, dt, last.active, self._idle_by_model)
        )
        free = dt * max(last.unallocated, 0.0)  # GPU-seconds
        rest = max(last.unattributed, 0.0)  # part of the energy
        ends = plan.ends
        for share in last.shares:
            end = ends.get(share[0])
            held = dt if end is None else min(max(end - t0, 0.0), dt)
            self._add(share, held, split)
            if held < dt:
                free += (dt - held) * share[2]
                rest += (1.0 - held / dt) * share[5]
        if plan.starts or plan.passing:
            before = {share[0] for share in last.shares}
            late = [(s, plan.starts[s[0]], t1) for s in plan.shares if s[0] in plan.starts]
            if split is not None:
                split.active = plan.active  # their activity is of this cycle
            for share, start, end in late + plan.passing:
                if share[0] in before:
                    continue
                held = max(min(end, t1) - max(start, t0), 0.0)
                self._add(share, held, split)
                free -= held * share[2]
                rest -= held / dt * share[5]
        gpu.unallocated += max(free, 0.0)
        if split is not None:  # the interval's energy is known
            gpu.unattributed += split.joules * max(rest, 0.0)
            gpu.activity_rest += max(split.joules * (1.0 - last.unknown) - split.given, 0.0)
        if last.unknown > 0:
            got = gpu.unknown.setdefault(last.reason, [0.0, 0.0])
            got[0] += dt * last.unknown
            got[1] += (joules or 0.0) * last.unknown

    def _add(self, share: Share, held: float, split: _Split | None) -> None:
        """Charge one holder ``held`` seconds of its share; ``split``: the GPU's energy over
        the interval (None: not known)."""
        acc = self.holders.get(share[0])
        if acc is None:
            return  # not counted (past max_holders)
        _, _, alloc, busy, idle, energy, active = share
        acc.allocated += held * alloc
        acc.busy += held * busy
        if idle:
            acc.idle += held * alloc
        if split is not None:
            part = held / split.dt
            acc.energy += split.joules * energy * part
            acc.activity_energy += split.take(alloc, active, part)

    def charged_to(self, gpu_key: str) -> tuple[float | None, float | None]:
        """(unix s, energy counter mJ) a GPU's counters are charged to; None not known."""
        plan = self._plans.get(gpu_key)
        if plan is not None:
            return plan.taken_at, plan.energy_mj
        return self._resume.get(gpu_key, (None, None))

    def resume(self, since: dict[str, tuple[float, float | None]]) -> None:
        """Charge each GPU's first interval from ``since`` (GPU key -> (unix s, energy mJ)
        a process before charged it to) as down time."""
        self._resume = dict(since)

    def _down(self, gpu_key: str, plan: GpuPlan) -> None:
        """Charge a GPU's first interval after a restart, from where the last process
        charged it to ``plan``, as down time (and the energy its counter says it used)."""
        since, energy_mj = self._resume.pop(gpu_key)
        gpu = self.gpus.get(gpu_key)
        if gpu is None or plan.taken_at <= since:
            return
        gpu.down += plan.taken_at - since
        if energy_mj is not None and plan.energy_mj is not None and plan.energy_mj >= energy_mj:
            gpu.down_energy += (plan.energy_mj - energy_mj) / 1000.0

    def _holder(self, key: HolderKey, labels: tuple[tuple[str, str], ...]) -> HolderTotals | None:
        acc = self.holders.get(key)
        if acc is not None:
            acc.ended_at = None
            acc.ended = None
            return acc
        if len(self.holders) >= self.max_holders and not self._evict_one():
            self.dropped["limit"] += 1
            self._warn.warning(
                "GPU accounting holds %d holders, its bound; holder %s is not counted",
                self.max_holders,
                "/".join(key[1:]),  # namespace/pod/container
            )
            return None
        acc = self.holders[key] = HolderTotals(key, labels)
        return acc

    def _evict_one(self) -> bool:
        """Drop the holder that ended longest ago; False when every holder still holds.
        The ended holders are listed once a cycle, so holders past the bound cost
        O(1) each, not a walk over every holder (20,000 live holders: 3 s a cycle)."""
        if self._evictable is None:
            ended = [a for a in self.holders.values() if a.ended_at is not None]
            self._evictable = sorted(ended, key=attrgetter("ended_at"), reverse=True)
        while self._evictable:
            oldest = self._evictable.pop()
            if oldest.ended_at is None:
                continue  # held again this cycle
            del self.holders[oldest.key]
            self.dropped["limit"] += 1
            return True
        return False

    def _end(self, live: set[HolderKey], gpus: set[str], now: float) -> None:
        """Mark holders and GPUs not seen this cycle as ended; drop those past retention."""
        gone = []
        for key, acc in self.holders.items():
            if key in live:
                continue
            if acc.ended_at is None:
                acc.ended_at = now
            elif now - acc.ended_at > self.retention_s:
                gone.append(key)
        for key in gone:
            del self.holders[key]
        self.dropped["retention"] += len(gone)
        for gpu_key in [k for k in self.gpus if k not in gpus]:
            g = self.gpus[gpu_key]
            if g.ended_at is None:
                g.ended_at = now
            elif now - g.ended_at > self.retention_s:
                del self.gpus[gpu_key]


class _Split:
    """One interval's energy of a GPU split by activity: its idle power (the lowest
    average power of an interval any GPU of its model on the node has drawn, so a GPU
    never idle since the start borrows an idle sibling's) by allocation, the power above
    it by each holder's activity over all the GPU's (by allocation when nothing was
    active)."""

    __slots__ = ("above", "active", "dt", "given", "idle", "joules")

    def __init__(
        self, gpu: GpuTotals, joules: float, dt: float, active: float, by_model: dict[str, float]
    ) -> None:
        model = dict(gpu.labels).get("modelName", "")
        # never above what this GPU drew before: its lows are lows of its model
        watts = min(joules / dt, by_model.get(model, math.inf))
        by_model[model] = gpu.idle_w = watts
        self.joules, self.dt, self.active = joules, dt, active
        self.idle = min(watts * dt, joules)  # the product can round above joules
        self.above = joules - self.idle
        self.given = 0.0  # joules given to holders so far

    def take(self, alloc: float, active: float, part: float) -> float:
        """Joules of a holder of ``alloc`` with ``active`` activity for ``part`` of the
        interval."""
        weight = active / self.active if self.active > 0 else alloc
        got = (self.idle * alloc + self.above * weight) * part
        self.given += got
        return got


def unaccounted(
    uses: Mapping[str, DeviceUse] | None, devices: Iterable[Device]
) -> tuple[Unaccounted, ...] | None:
    """The devices among ``devices`` with unaccounted processes, in their order; None
    without pod attribution (``uses`` None)."""
    if uses is None:
        return None
    out = []
    for dev in devices:
        use = uses.get(dev.key)
        if use is not None and use.unaccounted_processes:
            out.append(
                Unaccounted(dev, bool(use.claims), use.unaccounted_bytes, use.unaccounted_processes)
            )
    return tuple(out)


def replicas(
    uses: Mapping[str, DeviceUse] | None, devices: Iterable[Device]
) -> tuple[tuple[Device, int, str], ...]:
    """(device, replicas its shares are over, basis) of the devices held in replicas."""
    if uses is None:
        return ()
    out = []
    for dev in devices:
        use = uses.get(dev.key)
        if use is not None and use.replicas:
            out.append((dev, use.replicas, use.basis))
    return tuple(out)
