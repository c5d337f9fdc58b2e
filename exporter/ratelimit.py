"""Rate-limited logging, shared by the parts that report hostile or repeated input
(malformed requests, connection floods, failing reloads)."""

from __future__ import annotations

import logging
import time


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
