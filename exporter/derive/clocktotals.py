"""DCGM_EXP_CLOCK_EVENTS_TOTAL: per GPU and clock-event reason, the times it newly appeared.

dcgm-exporter 4.8.3 counts a reason when it is set in a sample of the clocks-event-reasons
bitmask and was not in the sample before (an edge), from the second sample of a GPU on
(the first only primes), in counters that start at 0 with the process. A GPU has a
series per reason once that reason has been counted. The bitmask is sampled once per
collection cycle, so a reason that comes and goes between two cycles is not seen.

This module produces data only; the exposition renders it.
"""

from __future__ import annotations

from collections import Counter

from exporter.derive.windows import CLOCK_EVENTS, REASON_FIELDS
from exporter.frame import Totals
from exporter.snapshot import Snapshot

_ORDER = {name: i for i, (_bit, name) in enumerate(CLOCK_EVENTS)}


class ClockEventTotals:
    """Edge counts of each GPU's clock-event reasons since the exporter started."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # GPU UUID -> the bitmask of its last sample
        self._counts: Counter[tuple[str, str]] = Counter()  # (GPU UUID, reason) -> count

    def update(self, snap: Snapshot) -> Totals:
        """Count the reasons that appeared since each GPU's last sample; every GPU's totals."""
        for g in snap.gpus:
            vals = snap.values.get(g.key, {})
            mask = next((int(vals[n]) for n in REASON_FIELDS if n in vals), None)
            if mask is None:
                continue  # not read this cycle: the next sample compares with the last one
            before = self._last.get(g.uuid)
            self._last[g.uuid] = mask
            if before is None:
                continue  # the first sample primes
            for bit, name in CLOCK_EVENTS:
                if mask & bit and not before & bit:
                    self._counts[(g.uuid, name)] += 1
        by_gpu: dict[str, list[tuple[str, int]]] = {}
        for (uuid, name), n in self._counts.items():
            by_gpu.setdefault(uuid, []).append((name, n))
        return {
            g.key: tuple(sorted(by_gpu[g.uuid], key=lambda p: _ORDER[p[0]]))
            for g in snap.gpus
            if g.uuid in by_gpu
        }

    def counts(self) -> dict[tuple[str, str], int]:
        """(GPU UUID, reason) -> count so far (for the state file)."""
        return dict(self._counts)

    def restore(self, counts: Counter[tuple[str, str]]) -> None:
        """Start from the counts a process before this one kept (reasons it knows only);
        the first sample of each GPU primes again."""
        self._counts = Counter({k: n for k, n in counts.items() if k[1] in _ORDER})
