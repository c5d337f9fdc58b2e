"""When each holder began and stopped holding its device, for accounting short pods.

The kubelet's ``List`` is asked at every cycle and, at intervals longer than
``SIGHT_S``, every ``SIGHT_S`` seconds between them (Poller): a pod that lives a few
seconds between two cycles is still seen. A holder's start is its container's
``startedAt`` from the API server where the watch is on (``finishedAt`` its end), else
the middle between the last answer that did not list it and the first that did (its
end, between the last that did and the first that did not): at most half a sighting
interval off per start and per stop, none on average.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from exporter.frame import HolderKey, Owner, Window

SIGHT_S = 5.0
"""Seconds between the kubelet answers asked between cycles (the cycle's interval when
it is shorter): a holder that lives longer than this is always seen."""
MAX_KEPT = 8192
"""Holders kept at once (live ones, and ended ones until the next cycle takes them)."""

Times = Callable[[Owner], tuple[float | None, float | None]]
"""A container's (startedAt, finishedAt) in unix seconds, None where not known."""


class Sightings:
    """Owns the holders seen so far and their windows since the last cycle."""

    def __init__(self, times: Times | None = None) -> None:
        self.times = times
        self._live: dict[HolderKey, tuple[Owner, float]] = {}  # -> (owner, share)
        self._windows: dict[HolderKey, tuple[Owner, Window]] = {}
        self._polled: float | None = None  # unix s of the last answer seen

    def see(self, owners: Mapping[str, tuple[Owner, ...]], shares: ShareOf, now: float) -> None:
        """Record one current kubelet answer: which ``owners`` hold each device key at
        ``now`` (unix s); ``shares`` gives a holder's part of its device."""
        before = self._polled
        current = {}
        for key, held in owners.items():
            for owner in held:
                hk = (key, owner.namespace, owner.pod, owner.container)
                current[hk] = owner
                if hk in self._live:
                    continue
                if len(self._live) >= MAX_KEPT:
                    break
                share = shares(key, owner)
                self._live[hk] = (owner, share)
                start = None if before is None else (before + now) / 2
                self._windows[hk] = (owner, Window(start, None, share))
        for hk in [k for k in self._live if k not in current]:
            owner, share = self._live.pop(hk)
            got = self._windows.get(hk)
            start = got[1].start if got is not None else None
            end = (before + now) / 2 if before is not None else now
            if len(self._windows) < MAX_KEPT or got is not None:
                self._windows[hk] = (owner, Window(start, end, share))
        self._polled = now

    def take(self) -> dict[HolderKey, Window]:
        """The windows of holders that began or stopped since the last call, with the API
        server's times where it has them; then forgotten."""
        out = {}
        for hk, (owner, w) in self._windows.items():
            start, end = w.start, w.end
            if self.times is not None:
                api_start, api_end = self.times(owner)
                if api_start is not None and start is not None:
                    start = api_start
                if api_end is not None and end is not None:
                    end = api_end
                if start is not None and end is not None and end < start:
                    end = start
            out[hk] = Window(start, end, w.share)
        self._windows = {}
        return out


ShareOf = Callable[[str, Owner], float]
"""A holder's part (0..1) of the device with this key, as the kubelet's answer gives it."""
