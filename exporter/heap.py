"""glibc heap tuning: fewer malloc arenas and freed memory handed back to the OS.

The worker thread builds a new exposition (about 1 MB of text and bytes) every
cycle and frees the last one. Spread over one arena per thread, freed blocks are
reused less and RSS creeps up; ``malloc_trim`` returns what stays free. Without
glibc (musl, macOS) both do nothing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

ARENAS = 2  # the event loop's thread and the worker share them
TRIM_EVERY = 100  # cycles between trims (one costs 0.06-0.25 ms)
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
    """Calls ``malloc_trim(0)`` every ``every`` ticks (each published cycle is one)."""

    def __init__(self, every: int = TRIM_EVERY) -> None:
        self.every = every
        self._trim = _libc("malloc_trim")
        self._ticks = 0

    def tick(self) -> None:
        self._ticks += 1
        if self._trim is not None and self._ticks % self.every == 0:
            self._trim(0)
