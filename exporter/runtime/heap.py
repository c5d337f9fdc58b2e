"""glibc heap tuning: fewer malloc arenas and freed memory handed back to the OS.

The worker thread builds a new exposition (about 1 MB of text and bytes) every
cycle and frees the last one. Spread over one arena per thread, freed blocks are
reused less and RSS creeps up; ``malloc_trim`` returns what stays free. Without
glibc (musl, macOS) both do nothing.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

ARENAS = 2  # the event loop's thread and the worker share them
TRIM_EVERY = 100  # cycles between trims (one costs 0.06-0.25 ms) ...
TRIM_S = 10.0  # ... or seconds, whichever comes first: what a burst freed goes back soon
_M_ARENA_MAX = -8  # mallopt parameter number in glibc's malloc.h


def _libc(name: str) -> Any:
    """The C library's function ``name``, or None without glibc."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def limit_arenas(n: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``n`` unless MALLOC_ARENA_MAX is set; True if applied."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_ARENA_MAX, n))


class Trimmer:
    """Calls ``malloc_trim(0)`` every ``every`` ticks or ``every_s`` seconds, whichever
    comes first (each published cycle is a tick)."""

    def __init__(self, every: int = TRIM_EVERY, every_s: float = TRIM_S) -> None:
        self.every, self.every_s = every, every_s
        self._trim = _libc("malloc_trim")
        self._ticks = 0
        self._last = time.monotonic()

    def tick(self) -> None:
        """Count a cycle; trim when one of the two has come round."""
        self._ticks += 1
        now = time.monotonic()
        if self._trim is None or (self._ticks < self.every and now - self._last < self.every_s):
            return
        self._trim(0)
        self._ticks, self._last = 0, now
