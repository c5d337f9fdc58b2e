"""How the NVML worker thread shares the CPU with the event loop.

With few cores and both threads busy, the event loop that a scrape wakes can wait
behind the worker for the rest of the worker's time slice (about 3 ms with Linux's
EEVDF scheduler), and then for the GIL. So the worker offers its core
(``sched_yield``, which releases the GIL too) between steps of a cycle: before each
NVML call and between the families of the render, at most once per ``EVERY_S``. With
nothing else waiting for the core a yield costs about 1 µs.
"""

from __future__ import annotations

import os
import time

EVERY_S = 0.0002  # seconds of work between two offers

_yield = getattr(os, "sched_yield", lambda: None)
_clock = time.perf_counter
_next = 0.0


def offer() -> None:
    """Let a waiting thread have the core (and the GIL) if EVERY_S has passed since the
    last offer."""
    global _next
    now = _clock()
    if now >= _next:
        _next = now + EVERY_S
        _yield()
