"""aiohttp's per-connection log, with malformed requests rate-limited.

aiohttp reports each request it cannot parse (a 400: oversized or malformed
headers, junk on the port) as an ERROR with a traceback; a scanner would fill
the log. :data:`HTTP_LOG` is the logger app.py gives aiohttp.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from exporter.runtime.ratelimit import RateLimited


class BadRequestLog(logging.Filter):
    """Turns aiohttp's report of a request it could not parse (a 400: oversized or
    malformed headers, junk on the port) from an ERROR with a traceback, per request,
    into one warning line a minute that counts the rest."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.limit = RateLimited(every_s)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or record.levelno < logging.ERROR:
            return True  # a real failure in a handler (or debug output): keep it whole
        held = self.limit.ready()
        if held is None:
            return False
        record.msg = "refused a malformed HTTP request (%s)%s"
        more = f"; {held} more since the last report" if held else ""
        record.args = (str(exc).replace("\n", " ")[:200], more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


HTTP_LOG = logging.getLogger("exporter.http")
"""aiohttp's per-connection logger (handler_args in app.py), with :class:`BadRequestLog`."""
HTTP_LOG.addFilter(BadRequestLog())
