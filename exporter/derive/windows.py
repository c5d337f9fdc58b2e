"""Windowed counts of the exporter-made families DCGM_EXP_XID_ERRORS_COUNT and
DCGM_EXP_CLOCK_EVENTS_COUNT, as dcgm-exporter computes them.

dcgm-exporter counts, per GPU, the samples of the last ``window_size_in_ms``:
each XID event counts once under its ``xid`` label; each sample of the
clocks-event-reasons bitmask counts once under every reason whose bit is set
(``clock_event`` label, dcgm-exporter's reason names). A GPU with nothing in the
window has one series with value 0 and no ``xid``/``clock_event`` label. Here
the bitmask is sampled once per collection cycle, so a reason active for a whole
window counts about window / interval.

This module produces data only; the exposition renders it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from exporter.frame import WindowCounts
from exporter.snapshot import Snapshot

K = TypeVar("K", bound=Hashable)

DEFAULT_WINDOW_S = 300.0
MAX_SLOTS = 10_000
"""At most this many cycles are kept per window (memory bound; oldest dropped first)."""

# dcgm-exporter's names for the bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS (same bits as NVML's).
CLOCK_EVENTS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "clocks_setting"),
    (0x004, "power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)
# Where a cycle's bitmask is found in a snapshot's values, first present wins.
REASON_FIELDS = (
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
)


def clock_events(mask: int) -> tuple[str, ...]:
    """dcgm-exporter's names of the reasons set in a clocks-event-reasons bitmask."""
    return tuple(name for bit, name in CLOCK_EVENTS if mask & bit)


class Window(Generic[K]):
    """Counts by key over the last ``window_s`` seconds, one slot per cycle.

    The totals are kept as slots come and go, so a cycle costs what it adds and what
    leaves the window, not a pass over every slot of the window.
    """

    def __init__(self, window_s: float, max_slots: int = MAX_SLOTS) -> None:
        if window_s <= 0:
            raise ValueError(f"window must be > 0 s, got {window_s}")
        self.window_s = window_s
        self.max_slots = max_slots
        self._slots: deque[tuple[float, Counter[K]]] = deque()
        self._total: Counter[K] = Counter()  # the sum of the slots

    def add(self, t: float, counts: Mapping[K, int]) -> None:
        """Record one cycle's counts at unix time ``t`` (s); zero counts are dropped."""
        kept = Counter({k: n for k, n in counts.items() if n > 0})
        if kept:
            if len(self._slots) >= self.max_slots:
                self._drop()
            self._slots.append((t, kept))
            self._total.update(kept)

    def counts(self, now: float) -> Counter[K]:
        """Totals of the slots newer than ``now - window_s``; older slots are forgotten."""
        start = now - self.window_s
        while self._slots and self._slots[0][0] <= start:
            self._drop()
        return Counter(self._total)

    def _drop(self) -> None:
        """Forget the oldest slot."""
        _t, old = self._slots.popleft()
        total = self._total
        for k, n in old.items():
            left = total[k] - n
            if left > 0:
                total[k] = left
            else:
                del total[k]


def series(
    devices: Iterable[str], counts: Mapping[tuple[str, str], int], window_s: float
) -> WindowCounts:
    """Per device, a series per label value counted, or one zero series (no label)."""
    by_dev: dict[str, list[tuple[str, int]]] = {}
    for (key, label), n in counts.items():
        by_dev.setdefault(key, []).append((label, n))
    out: list[tuple[str, str | None, int]] = []
    for key in devices:
        got = sorted(by_dev.get(key, ()), key=lambda p: (len(p[0]), p[0]))
        if got:
            out.extend((key, label, n) for label, n in got)
        else:
            out.append((key, None, 0))
    return WindowCounts(round(window_s * 1000), tuple(out))


class XidWindow:
    """DCGM_EXP_XID_ERRORS_COUNT: XIDs per physical GPU and code over the window."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window = Window[tuple[str, str]](window_s)
        self._seen: dict[tuple[str, int | None, int | None, int], int] = {}

    def update(self, snap: Snapshot) -> WindowCounts:
        """Add the XIDs that arrived since the previous snapshot; the window's counts."""
        gpus = {g.uuid: g.key for g in snap.gpus + snap.down if not g.is_mig}
        new: Counter[tuple[str, str]] = Counter()
        for uuid, gi, ci, xid, n in snap.xid.counts:
            delta = n - self._seen.get((uuid, gi, ci, xid), 0)
            self._seen[(uuid, gi, ci, xid)] = n
            key = gpus.get(uuid)
            if key is not None and delta > 0:
                new[(key, str(xid))] += delta
        self.window.add(snap.taken_at, new)
        counts = self.window.counts(snap.taken_at)
        return series([g.key for g in snap.gpus], counts, self.window.window_s)


class ClockEventWindow:
    """DCGM_EXP_CLOCK_EVENTS_COUNT: cycles each clock-event reason was active, per GPU."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window = Window[tuple[str, str]](window_s)

    def update(self, snap: Snapshot) -> WindowCounts:
        """Count this cycle's active reasons of every GPU; the window's counts."""
        new: Counter[tuple[str, str]] = Counter()
        for g in snap.gpus:
            vals = snap.values.get(g.key, {})
            mask = next((vals[n] for n in REASON_FIELDS if n in vals), None)
            if mask is not None:
                for name in clock_events(int(mask)):
                    new[(g.key, name)] += 1
        self.window.add(snap.taken_at, new)
        counts = self.window.counts(snap.taken_at)
        return series([g.key for g in snap.gpus], counts, self.window.window_s)


def from_config(cfg: Any) -> tuple[XidWindow, ClockEventWindow]:
    """The two windows sized by Config.xid_window_s and Config.clock_events_window_s (s)."""
    return (
        XidWindow(getattr(cfg, "xid_window_s", DEFAULT_WINDOW_S)),
        ClockEventWindow(getattr(cfg, "clock_events_window_s", DEFAULT_WINDOW_S)),
    )
