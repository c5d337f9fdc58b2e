"""XID errors from an NVML event set and from the kernel log, each read in a thread of its own.

The event thread blocks in ``nvmlEventSetWait_v2`` (``nvmlEventSetWait`` on drivers
without it, whose events name no MIG instance) and adds every event to counters by
(GPU, GPU instance, compute instance, XID), so no event is lost between scrapes however
many arrive; memory stays bounded by the number of distinct codes seen. An event that
names no instance (0xFFFFFFFF, the first wait, or a caller without the privilege to
watch MIG instances, to whom NVML reports only whole-device events) counts for the
whole GPU. A GPU fallen off the bus makes every wait on its set fail: the thread then
builds a set without it, so the other GPUs' XIDs keep coming.

XIDs 79, 119 and 120 come from the kernel log (exporter/nvml/xid/kmsg.py) when it can be
read, as DCGM reads them, and from NVML events too, as DCGM records both: each path is
tallied per GPU and code, and the count is the larger tally, so an XID both report
counts once and one that only NVML reported (its kernel record overwritten in the ring,
or cut) still counts; on the GPU, not its MIG instance, as the kernel log names none.
Without the kernel log they come from NVML events alone.
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
from exporter.nvml.session import DeviceLost, NvmlProblem, Session, Unavailable
from exporter.nvml.xid.kmsg import KERNEL_XIDS, BusKey, KernelLog, bus_key
from exporter.runtime.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

NO_INSTANCE = 0xFFFFFFFF
_KERNEL, _NVML = 0, 1  # the two paths of XIDs 79, 119 and 120
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
LOG_LINES_PER_MINUTE = 10
"""XID lines a minute in all, whatever the number of devices and codes; one line then
says how many were held back (each is logged with its count once its turn comes)."""


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
    """Owns the event set and the thread that waits on it, and the kernel-log reader."""

    def __init__(self, session: Session, kernel_log: str | None = None) -> None:
        self.session = session
        self.kernel_log = kernel_log
        self._kernel: KernelLog | None = None
        self._bus: dict[BusKey, str] = {}  # PCI address -> GPU UUID, every GPU seen
        self.unknown_bus = 0  # kernel-log XIDs of a PCI address no GPU had
        self._v1 = False  # the driver lacks nvmlEventSetWait_v2
        self._lock = threading.Lock()
        self._counts: Counter[Key] = Counter()
        # (GPU UUID, XID of KERNEL_XIDS) -> [kernel-log tally, NVML tally]; the count is the max
        self._paths: dict[tuple[str, int], list[int]] = {}
        self._last: dict[str, int] = {}
        self._registered: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: dict[Key, tuple[float, int]] = {}
        self._lines = RateLimitedLog(log, LOG_LINES_PER_MINUTE)
        self.healthy = True

    def watch(self, gpus: Sequence[Device]) -> None:
        """(Re)register for XIDs when the set of GPUs changed; cheap when it did not."""
        for g in gpus:
            if g.uuid not in self._bus.values():
                key = bus_key(dict(g.labels).get("pci_bus_id", ""))
                if key is not None:
                    self._bus[key] = g.uuid
        if self.kernel_log and self._kernel is None:
            self._follow_kernel_log(self.kernel_log)
        keys = frozenset(g.key for g in gpus)
        if keys == self._registered and self._thread is not None and self._thread.is_alive():
            return
        self.stop()
        evset, by_handle = self._event_set(gpus)
        self._registered = keys
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(evset, by_handle, tuple(gpus), self._stop),
            name="xid-events",
            daemon=True,
        )
        self._thread.start()
        self.healthy = True

    def _follow_kernel_log(self, path: str) -> None:
        """Start the kernel-log reader; say once if it cannot read the log."""
        self._kernel = KernelLog(path, self._kernel_xid)
        why = self._kernel.start()
        if why:
            log.warning(
                "kernel log: %s; XIDs %s are counted from NVML events only, which may never "
                "carry them (the privileged-xids deploy component gives the exporter the log)",
                why,
                ", ".join(map(str, sorted(KERNEL_XIDS))),
            )

    def _event_set(self, gpus: Sequence[Device]) -> tuple[object, dict[int, str]]:
        """A new event set with every GPU of ``gpus`` that can be registered."""
        try:
            evset = self.session.run("nvmlEventSetCreate")
        except NvmlProblem:
            self.healthy = False
            raise
        by_handle: dict[int, str] = {}
        for g in gpus:
            try:
                self.session.run("nvmlDeviceRegisterEvents", g.handle, _XID, evset)
            except DeviceLost:
                continue  # the cycle reports it lost
            except NvmlProblem as e:
                log.warning("GPU %d (%s): cannot watch XID events: %s", g.index, g.uuid, e)
                continue
            by_handle[_addr(g.handle)] = g.uuid
        return evset, by_handle

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

    def close(self, join_s: float | None = None) -> bool:
        """Stop both threads; True when the event thread has ended (see :meth:`stop`)."""
        if self._kernel is not None:
            self._kernel.stop(0.0 if join_s is not None else WAIT_MS / 1000 * 2)
        return self.stop(join_s)

    def _run(
        self,
        evset: object,
        by_handle: dict[int, str],
        gpus: tuple[Device, ...],
        stop: threading.Event,
    ) -> None:
        try:
            while not stop.is_set():
                try:
                    data = self._wait(evset, WAIT_MS)
                except DeviceLost:  # a GPU of the set is lost: a set without it
                    evset, by_handle = self._without_lost(evset, by_handle, gpus, stop)
                    continue
                except NvmlProblem:  # counted by the session
                    self.healthy = False
                    stop.wait(1.0)  # the driver may be going away; do not spin
                    continue
                if data is not None:
                    self._record(data, by_handle)
            self._drain(evset, by_handle)
        finally:
            self.session.release("nvmlEventSetFree", evset)

    def _without_lost(
        self,
        evset: object,
        by_handle: dict[int, str],
        gpus: tuple[Device, ...],
        stop: threading.Event,
    ) -> tuple[object, dict[int, str]]:
        """A new set of the GPUs that still register, for the one that answers
        GPU_IS_LOST for all of them; the old set when none can be made or none left it."""
        try:
            new, registered = self._event_set(gpus)
        except NvmlProblem:
            stop.wait(1.0)
            return evset, by_handle
        if len(registered) >= len(by_handle):  # the lost GPU registers still: no use
            self.session.release("nvmlEventSetFree", new)
            self.healthy = False
            stop.wait(1.0)
            return evset, by_handle
        gone = sorted(set(by_handle.values()) - set(registered.values()))
        log.warning("XID events: %s lost; watching the other GPUs", ", ".join(gone))
        self.session.release("nvmlEventSetFree", evset)
        return new, registered

    def _wait(self, evset: object, timeout_ms: int) -> N.c_nvmlEventData_t | None:
        """The next event within ``timeout_ms``, or None."""
        if not self._v1:
            try:
                return self.session.run("nvmlEventSetWait_v2", evset, timeout_ms, empty=_TIMEOUT)
            except Unavailable as e:  # absent, or NOT_SUPPORTED: DCGM takes v1 then too
                if e.code not in (N.NVML_ERROR_FUNCTION_NOT_FOUND, N.NVML_ERROR_NOT_SUPPORTED):
                    raise
                self._v1 = True
                log.info("nvmlEventSetWait_v2: %s; XIDs from nvmlEventSetWait, per GPU only", e)
        # the first version fills no instance ids: preset, they read "none"
        data = N.c_nvmlEventData_t()
        data.gpuInstanceId = data.computeInstanceId = NO_INSTANCE
        wait = (evset, ctypes.byref(data), ctypes.c_uint(timeout_ms))
        return data if self.session.c_call("nvmlEventSetWait", *wait, empty=_TIMEOUT) else None

    def _drain(self, evset: object, by_handle: dict[int, str]) -> None:
        """Count what the set holds already (no waiting), at most MAX_DRAIN events."""
        for _ in range(MAX_DRAIN):
            try:
                data = self._wait(evset, 0)
            except NvmlProblem:  # the set or the driver is gone: nothing left to take
                return
            if data is None:
                return
            self._record(data, by_handle)

    def _record(self, data: N.c_nvmlEventData_t, by_handle: dict[int, str]) -> None:
        uuid = by_handle.get(_addr(data.device))
        xid = int(data.eventData)
        if uuid is None:
            return  # not ours
        self.healthy = True
        if xid in KERNEL_XIDS and self.from_kernel_log:
            self._either(uuid, xid, _NVML)  # the kernel log may report it too
            return
        gi = None if data.gpuInstanceId == NO_INSTANCE else int(data.gpuInstanceId)
        ci = None if gi is None or data.computeInstanceId == NO_INSTANCE else data.computeInstanceId
        self._count((uuid, gi, None if ci is None else int(ci), xid))

    @property
    def from_kernel_log(self) -> bool:
        """Whether XIDs 79, 119 and 120 are counted from the kernel log now."""
        return self._kernel is not None and self._kernel.running

    def _kernel_xid(self, bus: BusKey, xid: int) -> None:
        """An XID record of the kernel log: counted for its GPU if it is one of KERNEL_XIDS
        (the rest come as NVML events); the kernel names no MIG instance."""
        if xid not in KERNEL_XIDS:
            return
        uuid = self._bus.get(bus)
        if uuid is None:
            self.unknown_bus += 1
            return
        self._either(uuid, xid, _KERNEL)

    def _either(self, uuid: str, xid: int, path: int) -> None:
        """One report of a KERNEL_XIDS code by ``path``: counted when it makes that path's
        tally the larger one (the other path has not reported it yet)."""
        with self._lock:
            tally = self._paths.setdefault((uuid, xid), [0, 0])
            tally[path] += 1
            new = tally[path] > tally[1 - path]
        if new:
            self._count((uuid, None, None, xid))

    def _count(self, key: Key) -> None:
        uuid, _, _, xid = key
        with self._lock:
            self._counts[key] += 1
            self._last[uuid] = xid
            total = self._counts[key]
        self._log(key, total)

    def _log(self, key: Key, total: int) -> None:
        """Log an XID, at most once per LOG_EVERY_S per (GPU, instance, XID) and
        LOG_LINES_PER_MINUTE XID lines a minute in all.

        During a storm (thousands a second) every event is still counted; the
        log says how many arrived since its previous line instead of repeating.
        """
        now = time.monotonic()
        at, logged_total = self._logged.get(key, (-LOG_EVERY_S, 0))
        if now - at < LOG_EVERY_S:
            return
        uuid, gi, ci, xid = key
        where = "" if gi is None else f" GPU instance {gi}"
        where += "" if ci is None else f" compute instance {ci}"
        more = total - logged_total - 1
        if more > 0:
            said = self._lines.warning(
                "XID %d on %s%s (%d more since the last report)", xid, uuid, where, more
            )
        else:
            said = self._lines.warning("XID %d on %s%s", xid, uuid, where)
        if said:  # else this key's next line, in a later minute, carries the count
            self._logged[key] = (now, total)

    def state(self) -> XidState:
        with self._lock:
            counts = tuple((u, gi, ci, x, n) for (u, gi, ci, x), n in self._counts.items())
            last = tuple(self._last.items())
        return XidState(counts, last)
