"""The header budget: the total size of each request's line and headers, counted on the
raw bytes of a connection (exporter.http.connections answers 431 past it).

The budget follows the request framing of RFC 9112 through every request of a
connection, pipelined or not: a body of Content-Length bytes is passed over, a chunked
body (section 7.1) is followed chunk by chunk, and its trailer section is counted like
a head. It only ever passes over bytes that aiohttp's parser reads as a body too: framing
it does not recognise (a chunk size that is not plain hex, a Transfer-Encoding whose last
coding is not chunked) stops the passing over, and every later byte of the connection
counts against the budget, so a request parsed differently costs at most ``limit`` bytes.
"""

from __future__ import annotations

import re

_LENGTH = re.compile(rb"\r?\ncontent-length[ \t]*:[ \t]*(\d{1,12})[ \t]*\r?\n", re.IGNORECASE)
_CODINGS = re.compile(rb"\r?\ntransfer-encoding[ \t]*:([^\r\n]*)", re.IGNORECASE)
_CHUNK_SIZE = re.compile(rb"([0-9a-fA-F]{1,15})[ \t]*(?:;[^\r\n]*)?\r?")  # then the LF
_BLANK_LINE = re.compile(rb"\r\n\r\n|\n\n")  # ends a head or a trailer section

# What the bytes being read are: a request head, a chunk-size line, the line end after a
# chunk's data, a trailer section; or (LOST) framing not followed: everything counts.
HEAD, SIZE, DATA_END, TRAILERS, LOST = range(5)


class HeaderBudget:
    """Follows one connection's byte stream request by request; :meth:`feed` is False once
    a request head, a chunk-size line or a trailer section is over ``limit`` bytes (or,
    framing lost, once the bytes since are). Holds at most ``limit`` + one read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()  # the current head, chunk line or trailer section so far
        self.state = HEAD
        self._skip = 0  # body or chunk-data bytes to pass before the next part

    def feed(self, data: bytes) -> bool:
        """Account for ``data``; False when a head is over the budget."""
        view = memoryview(data)
        while len(view):
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            if self.state == HEAD and not self.head:
                view = view[_blank_lines(view) :]  # RFC 9112 2.2: empty lines before a request
            start = max(0, len(self.head) - 3)
            self.head += view
            end = None if self.state == LOST else _part_end(self.head, start, self.state)
            if end is None:
                return len(self.head) <= self.limit
            if end > self.limit:
                return False
            part = bytes(self.head[:end])
            view = view[len(view) - (len(self.head) - end) :]
            self.head = bytearray()
            self._next(part)
        return True

    def _next(self, part: bytes) -> None:
        """Move past a complete ``part`` of the current state."""
        if self.state == HEAD:
            codings = _CODINGS.findall(part)
            if codings:  # RFC 9112 6.3: Transfer-Encoding overrides Content-Length
                last = codings[-1].rpartition(b",")[2].strip().lower()
                self.state = SIZE if last == b"chunked" else LOST
                return
            m = _LENGTH.search(part)
            self._skip = int(m.group(1)) if m else 0
        elif self.state == SIZE:
            m = _CHUNK_SIZE.fullmatch(part[:-1])
            if m is None:
                self.state = LOST
                return
            size = int(m.group(1), 16)
            self.state = DATA_END if size else TRAILERS
            self._skip = size
        elif self.state == DATA_END:
            self.state = SIZE if part.strip(b"\r\n") == b"" else LOST
        else:  # TRAILERS: the request is complete
            self.state = HEAD


def _blank_lines(view: memoryview) -> int:
    """How many CR and LF bytes ``view`` starts with."""
    n = 0
    while n < len(view) and view[n] in b"\r\n":
        n += 1
    return n


def _part_end(buf: bytearray, start: int, state: int) -> int | None:
    """Index just past the end of the part of ``state`` in ``buf`` (from ``start``), or None:
    a head ends at a blank line, a chunk-size line and a chunk's line end at the first LF,
    a trailer section at a blank line or at once, when it is empty."""
    if state in (SIZE, DATA_END):
        lf = buf.find(b"\n", start)
        return lf + 1 if lf >= 0 else None
    if state == TRAILERS:
        if buf.startswith(b"\n"):
            return 1
        if buf.startswith(b"\r\n"):
            return 2
    blank = _BLANK_LINE.search(buf, start)  # the first CRLF CRLF or LF LF
    return blank.end() if blank else None
