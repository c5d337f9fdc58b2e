"""The simulated kernel log: the driver's messages as /dev/kmsg records, appended to a file.

Each record is one line, ``<priority>,<sequence>,<microseconds since boot>,<flags>;<text>``,
the form /dev/kmsg gives a reader; the NVIDIA driver's XID reports read
``NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., GPU has fallen off the bus.``, an
instance's ``NVRM: Xid (PCI:0000:18:00 GPU-I:02 GPU-CI:00): 13, ...``.
The file is written with one ``write`` per record, so a reader sees whole lines.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

WARNING = 4  # the driver reports XIDs at KERN_WARNING


def xid_text(
    bus_id: str,
    xid: int,
    detail: str,
    pid: int | None = None,
    gi: int | None = None,
    ci: int | None = None,
) -> str:
    """The driver's XID line for a GPU at ``bus_id`` (``00000000:18:00.0``), in the form of
    the open driver's kernel_rc.c: ``Xid (PCI:%04x:%02x:%02x)``, or with a MIG instance
    ``Xid (PCI:%04x:%02x:%02x GPU-I:%02u)`` and ``... GPU-I:%02u GPU-CI:%02u)``
    (XID_PRINT_WITH_ATTR)."""
    domain, bus, device = bus_id.split(".")[0].split(":")
    pci = f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    if gi is not None:
        pci += f" GPU-I:{gi:02d}" + (f" GPU-CI:{ci:02d}" if ci is not None else "")
    who = f"pid={pid}, name=python3" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{pci}): {xid}, {who}, {detail}"


class KernelLog:
    """Appends records to ``path`` (created empty if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seq = itertools.count(int(time.monotonic() * 1000) % 100000)
        self._lock = threading.Lock()
        self.path.touch()

    def write(self, text: str, priority: int = WARNING) -> None:
        """One record, stamped with the real monotonic clock (µs, as the kernel's)."""
        usec = time.monotonic_ns() // 1000
        with self._lock:
            record = f"{priority},{next(self._seq)},{usec},-;{text}\n".encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, record)
            finally:
                os.close(fd)
