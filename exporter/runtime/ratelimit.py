"""Rate-limited logging, shared by the parts that report hostile or repeated input
(malformed requests, connection floods, failing reloads, kubelet and API answers)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimited:
    """Lets one report through per ``every_s`` seconds and counts the ones it held back."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last = float("-inf")
        self.quiet = 0  # held back since the last report

    def ready(self) -> int | None:
        """None: hold this report back. Otherwise the count held back before it (then reset)."""
        now = time.monotonic()
        if now - self._last < self.every_s:
            self.quiet += 1
            return None
        self._last, held, self.quiet = now, self.quiet, 0
        return held

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
        """Log ``msg`` unless one was logged less than ``every_s`` ago; True when logged."""
        held = self.ready()
        if held is None:
            return False
        more = f" ({held} more since the last report)" if held else ""
        logger.log(level, msg + "%s", *args, more)
        return True


LOG_LINES_PER_MINUTE = 5
"""Warnings a :class:`RateLimitedLog` lets through per minute by default."""


class RateLimitedLog:
    """Warnings limited to ``per_minute`` lines a minute; what is held back is
    summed up in one line when the next minute begins."""

    def __init__(
        self,
        logger: logging.Logger,
        per_minute: int = LOG_LINES_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._window = float("-inf")
        self._lines = 0
        self.suppressed = 0

    def warning(self, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless this minute's lines are used up; True if logged."""
        with self._lock:
            now = self._clock()
            if now - self._window >= 60.0:
                if self.suppressed:
                    self._log.warning(
                        "%d more warnings like the above in the last minute were not logged",
                        self.suppressed,
                    )
                self._window, self._lines, self.suppressed = now, 0, 0
            if self._lines >= self._per_minute:
                self.suppressed += 1
                return False
            self._lines += 1
        self._log.warning(msg, *args)
        return True
