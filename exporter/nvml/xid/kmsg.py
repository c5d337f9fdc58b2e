"""XIDs from the kernel log (/dev/kmsg), read in a thread of their own.

The NVIDIA driver reports every XID in the kernel log as
``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <details>`` (one on a MIG instance
as ``Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:00): ...``, counted on its GPU). DCGM 4.x reads
XIDs 79 (GPU fallen off the bus), 119 and 120 (GSP timeout and error) from there,
since NVML events may never carry them; :data:`KERNEL_XIDS` are those codes.

/dev/kmsg gives one record per read, ``<prio>,<seq>,<usec>,<flags>;<text>``
followed by continuation lines that start with a space; a regular file or a FIFO
(tests, the simulator) gives the same lines in chunks. The log is read from its
oldest record, as DCGM reads it: XIDs 79, 119, 120 the kernel still holds from before
the start count too (only they are counted from here, so none twice). Every
input is bounded: a read takes at most READ_BYTES, a line longer than MAX_LINE is
dropped, at most MAX_RECORDS_PER_S records are looked at a second (the kernel keeps
the rest; when its ring buffer overwrote some, the read says so with EPIPE and the
loss is counted), and nothing is kept but the current line.

A regular file (``--kernel-log`` on a file a logger writes) is followed as
``tail -F`` follows one: at its end the reader looks whether it was truncated (shorter
than what was read, or its last bytes read no longer there: truncated and rewritten)
and reads it again from its start, or rotated (the path names another file: renamed
away, a new one created) and opens the new one from its start, after reading the old
one to its end.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

KERNEL_XIDS = frozenset({79, 119, 120})
READ_BYTES = 8192  # /dev/kmsg: one record per read (at most about 2 KiB, PRINTK_MESSAGE_MAX)
MAX_LINE = 4096
MAX_RECORDS_PER_S = 20_000
WAIT_S = 1.0  # a poll's timeout: the thread sees a stop within this
EOF_WAIT_S = 0.2  # a regular file at its end: look again after this
TAIL_BYTES = 64  # a regular file's last bytes read, to tell a rewrite from new lines
# The open driver's forms (kernel_rc.c): ``Xid (PCI:0000:3b:00)``, and for a MIG instance
# (XID_PRINT_WITH_ATTR) ``Xid (PCI:0000:3b:00 GPU-I:02)`` or ``... GPU-I:02 GPU-CI:00)``
_XID = re.compile(
    rb"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})[^) ]{0,4}"
    rb"(?: GPU-I:\d{1,3}(?: GPU-CI:\d{1,3})?)?\): (\d{1,5}),"
)

BusKey = tuple[int, int, int]  # PCI domain, bus, device


def bus_key(bus_id: str) -> BusKey | None:
    """(domain, bus, device) of ``00000000:3B:00.0`` or ``0000:3b:00``; None if malformed."""
    parts = bus_id.split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return domain, bus, device


def parse(line: bytes) -> tuple[BusKey, int] | None:
    """(PCI address, XID) of a driver's XID record, or None for any other line."""
    if b"NVRM: Xid" not in line:
        return None
    m = _XID.search(line)
    if m is None:
        return None
    domain, bus, device, xid = m.groups()
    return (int(domain, 16), int(bus, 16), int(device, 16)), int(xid)


class KernelLog:
    """Follows a kernel log and hands each XID record to ``on_xid(bus, xid)``."""

    def __init__(self, path: str, on_xid: Callable[[BusKey, int], None]) -> None:
        self.path = path
        self.on_xid = on_xid
        self.lost = 0  # records the kernel overwrote before they were read
        self.dropped = 0  # lines over MAX_LINE
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Open the log and follow it in a thread; "" when it runs, else why it cannot."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            return f"cannot read {self.path}: {e.strerror}"
        # Read from the oldest record the kernel still holds, as DCGM's DcgmKmsgReader does
        # (open, no seek): an XID 79 logged while the exporter was restarting (its own
        # exit-3 restart after the GPU fell off the bus) is counted, not lost.
        self._thread = threading.Thread(
            target=self._run, args=(fd,), name="kernel-log", daemon=True
        )
        self._thread.start()
        return ""

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, join_s: float = WAIT_S * 2) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_s)

    def _run(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        lines = _Lines(self)
        follow = _Follow(self.path) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        second, seen = time.monotonic(), 0
        try:
            while not self._stop.is_set():
                if not poller.poll(WAIT_S * 1000):
                    continue
                chunk = self._read(fd)
                if chunk is None:
                    return
                if not chunk:  # a regular file at its end, a FIFO without a writer
                    self._stop.wait(EOF_WAIT_S)
                    # before reading on: whatever was written since may be a new file's
                    if follow is not None and (new := follow.at_end(fd)) is not None:
                        poller.unregister(fd)
                        fd = new
                        poller.register(fd, select.POLLIN)
                        lines.partial, lines.skipping = b"", False
                    continue
                if follow is not None:
                    follow.read(chunk)
                seen += lines.feed(chunk)
                if seen >= MAX_RECORDS_PER_S:  # over the rate: the kernel holds the rest
                    self._stop.wait(max(0.0, second + 1.0 - time.monotonic()))
                if time.monotonic() - second >= 1.0:
                    second, seen = time.monotonic(), 0
        finally:
            os.close(fd)

    def _read(self, fd: int) -> bytes | None:
        """The next record or chunk; b"" when there is none; None when reading failed."""
        try:
            return os.read(fd, READ_BYTES)
        except BlockingIOError:
            return b""
        except OSError as e:
            if e.errno == errno.EPIPE:  # the kernel overwrote records we had not read
                self.lost += 1
                return b""
            log.warning("kernel log %s: %s; XIDs 79, 119, 120 from NVML events only", self.path, e)
            return None


class _Lines:
    """Splits chunks into lines, keeping at most MAX_LINE bytes of an unfinished one."""

    def __init__(self, reader: KernelLog) -> None:
        self.reader = reader
        self.partial = b""
        self.skipping = False  # inside a line already too long: drop up to its end

    def feed(self, chunk: bytes) -> int:
        """Hand the complete lines of ``chunk`` on; returns how many there were."""
        if self.skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return 0
            chunk, self.skipping = chunk[end + 1 :], False
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            self.reader.dropped += 1
            self.partial, self.skipping = b"", True
        for line in lines:
            if len(line) > MAX_LINE:
                self.reader.dropped += 1
                continue
            got = parse(line)
            if got is not None:
                self.reader.on_xid(*got)
        return len(lines)


class _Follow:
    """Whether a regular file at its end was truncated, rewritten or rotated (see above)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tail = b""  # the last TAIL_BYTES bytes read

    def read(self, chunk: bytes) -> None:
        self.tail = (self.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]

    def at_end(self, fd: int) -> int | None:
        """At the end of ``fd`` a moment ago: the descriptor to read on (``fd`` itself, put
        back at its start, when the file was truncated or rewritten; the path's new file
        when it was rotated, ``fd`` then closed), or None when nothing changed."""
        try:
            st, now = os.fstat(fd), os.stat(self.path)
        except OSError:  # renamed away and not created again yet: keep the old one
            return None
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            if st.st_size > pos:  # the old file's last lines first
                return None
            try:
                new = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                return None
            os.close(fd)
            self.tail = b""
            log.info("kernel log %s: a new file; reading it from its start", self.path)
            return new
        n = len(self.tail)
        if st.st_size < pos or (n and os.pread(fd, n, pos - n) != self.tail):
            os.lseek(fd, 0, os.SEEK_SET)
            self.tail = b""
            log.info("kernel log %s: truncated; reading it from its start", self.path)
            return fd
        return None
