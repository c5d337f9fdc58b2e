"""XID errors from an NVML event set, read in a thread of their own.

The thread blocks in ``nvmlEventSetWait_v2`` and adds every event to counters
by (GPU, GPU instance, compute instance, XID), so no event is lost between scrapes however many
arrive; memory stays bounded by the number of distinct codes seen.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.session import NvmlProblem, Session

log = logging.getLogger(__name__)

NO_INSTANCE = 0xFFFFFFFF
_XID = N.nvmlEventTypeXidCriticalError
_TIMEOUT = frozenset({N.NVML_ERROR_TIMEOUT})  # no event within the wait
Key = tuple[str, int | None, int | None, int]  # GPU UUID, GPU instance, compute instance, XID
WAIT_MS = 1000
"""One nvmlEventSetWait_v2 call's timeout, so the idle thread wakes once a second. Each wake
costs a timer and a thread switch (about 0.3 ms of CPU on a small VM): at ten a second they
cost more than collecting every 30 s. A stop is seen within one wait; re-registering waits
for it, a SIGTERM does not (see :meth:`XidWatcher.stop`)."""
MAX_DRAIN = 4096
"""Events still in a set when its thread stops that are taken off and counted, at most."""
LOG_EVERY_S = 60.0
"""An XID repeating on a device is logged at most once per this many seconds."""


@dataclass(frozen=True, slots=True)
class XidState:
    """Counts by (GPU UUID, GPU-instance id, compute-instance id, XID) and the last XID per GPU.

    Instance ids are None when the event names no MIG instance.
    """

    counts: tuple[tuple[str, int | None, int | None, int, int], ...] = ()
    last: tuple[tuple[str, int], ...] = ()


def _addr(handle: Any) -> int:
    """A device handle's pointer value, the key events are matched by."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class XidWatcher:
    """Owns the event set and the thread that waits on it."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._counts: Counter[Key] = Counter()
        self._last: dict[str, int] = {}
        self._registered: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: dict[Key, tuple[float, int]] = {}
        self.healthy = True

    def watch(self, gpus: Sequence[Device]) -> None:
        """(Re)register for XIDs when the set of GPUs changed; cheap when it did not."""
        keys = frozenset(g.key for g in gpus)
        if keys == self._registered and self._thread is not None and self._thread.is_alive():
            return
        self.stop()
        try:
            evset = self.session.run("nvmlEventSetCreate")
        except NvmlProblem:
            self.healthy = False
            raise
        by_handle: dict[int, str] = {}
        for g in gpus:
            try:
                self.session.run("nvmlDeviceRegisterEvents", g.handle, _XID, evset)
            except NvmlProblem as e:
                log.warning("GPU %d (%s): cannot watch XID events: %s", g.index, g.uuid, e)
                continue
            by_handle[_addr(g.handle)] = g.uuid
        self._registered = keys
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(evset, by_handle, self._stop), name="xid-events", daemon=True
        )
        self._thread.start()
        self.healthy = True

    def stop(self, join_s: float | None = None) -> bool:
        """Stop the thread; True when it has ended, its set counted and freed.

        Waits up to ``join_s`` seconds for it (default four waits: it ends within one).
        Events the set already holds are counted before it is freed: an XID that
        arrives as the watcher re-registers (the GPU set changed, the driver went
        away) is not lost with the old set. A thread still in its wait after a
        shorter ``join_s`` ends by itself when the wait returns.
        """
        self._stop.set()
        ended = True
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 4 if join_s is None else join_s)
            ended = not self._thread.is_alive()
            self._thread = None
        self._registered = frozenset()
        return ended

    def _run(self, evset: object, by_handle: dict[int, str], stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    data = self.session.run("nvmlEventSetWait_v2", evset, WAIT_MS, empty=_TIMEOUT)
                except NvmlProblem:  # counted by the session
                    self.healthy = False
                    stop.wait(1.0)  # the driver may be going away; do not spin
                    continue
                if data is not None:
                    self._record(data, by_handle)
            self._drain(evset, by_handle)
        finally:
            self.session.release("nvmlEventSetFree", evset)

    def _drain(self, evset: object, by_handle: dict[int, str]) -> None:
        """Count what the set holds already (no waiting), at most MAX_DRAIN events."""
        for _ in range(MAX_DRAIN):
            try:
                data = self.session.run("nvmlEventSetWait_v2", evset, 0, empty=_TIMEOUT)
            except NvmlProblem:  # the set or the driver is gone: nothing left to take
                return
            if data is None:
                return
            self._record(data, by_handle)

    def _record(self, data: N.c_nvmlEventData_t, by_handle: dict[int, str]) -> None:
        uuid = by_handle.get(_addr(data.device))
        if uuid is None:
            return
        gi = None if data.gpuInstanceId == NO_INSTANCE else int(data.gpuInstanceId)
        ci = None if gi is None or data.computeInstanceId == NO_INSTANCE else data.computeInstanceId
        xid = int(data.eventData)
        key = (uuid, gi, None if ci is None else int(ci), xid)
        with self._lock:
            self._counts[key] += 1
            self._last[uuid] = xid
            total = self._counts[key]
        self.healthy = True
        self._log(key, total)

    def _log(self, key: Key, total: int) -> None:
        """Log an XID, at most once per LOG_EVERY_S per (GPU, instance, XID).

        During a storm (thousands a second) every event is still counted; the
        log says how many arrived since its previous line instead of repeating.
        """
        now = time.monotonic()
        at, logged_total = self._logged.get(key, (-LOG_EVERY_S, 0))
        if now - at < LOG_EVERY_S:
            return
        self._logged[key] = (now, total)
        uuid, gi, ci, xid = key
        where = "" if gi is None else f" GPU instance {gi}"
        where += "" if ci is None else f" compute instance {ci}"
        more = total - logged_total - 1
        if more > 0:
            log.warning("XID %d on %s%s (%d more since the last report)", xid, uuid, where, more)
        else:
            log.warning("XID %d on %s%s", xid, uuid, where)

    def state(self) -> XidState:
        with self._lock:
            counts = tuple((u, gi, ci, x, n) for (u, gi, ci, x), n in self._counts.items())
            last = tuple(self._last.items())
        return XidState(counts, last)
