"""The header budget: the total size of each request's line and headers, counted on the
raw bytes of a connection (exporter.http.connections answers 431 past it)."""

from __future__ import annotations

import re

_LENGTH = re.compile(rb"\r?\ncontent-length[ \t]*:[ \t]*(\d{1,12})[ \t]*\r?\n", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r?\ntransfer-encoding[ \t]*:", re.IGNORECASE)


class HeaderBudget:
    """Follows the request heads in a connection's byte stream (pipelined requests and
    bodies with a Content-Length skipped); :meth:`feed` is False once a head (request
    line and headers) is over ``limit`` bytes. Holds at most ``limit`` + one chunk."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()  # the current request's head so far
        self._skip = 0  # body bytes to pass before the next request's head
        self._counting = True  # False after a chunked body: per-field limits still apply

    @property
    def between(self) -> bool:
        """Whether the stream is between requests (no partial head or body pending)."""
        return not self.head and not self._skip and self._counting

    def feed(self, data: bytes) -> bool:
        """Account for ``data``; False when a head is over the budget."""
        view = memoryview(data)
        while self._counting and len(view):
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            start = max(0, len(self.head) - 3)
            self.head += view
            end = _head_end(self.head, start)
            if end < 0:
                return len(self.head) <= self.limit
            if end > self.limit:
                return False
            head = bytes(self.head[:end])
            view = view[len(view) - (len(self.head) - end) :]
            self.head = bytearray()
            if _CHUNKED.search(head):
                self._counting = False
            m = _LENGTH.search(head)
            self._skip = int(m.group(1)) if m else 0
        return True


def _head_end(buf: bytearray, start: int) -> int:
    """Index just past the blank line ending a head in ``buf`` (from ``start``), or -1."""
    crlf, lf = buf.find(b"\r\n\r\n", start), buf.find(b"\n\n", start)
    if crlf >= 0 and (lf < 0 or crlf <= lf):
        return crlf + 4
    return lf + 2 if lf >= 0 else -1
