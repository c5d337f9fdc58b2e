"""A scrape answered in the connection guard, without aiohttp's request pipeline.

``GET /metrics`` is the one request a Prometheus server repeats all day, and its
answer is bytes the poller built once per cycle. When such a request arrives whole
in one read, on a connection with nothing else pending, and is a plain
``GET /metrics HTTP/1.1`` whose every header line is well formed and none asks for
more than the body (no body, ``Connection``, ``Upgrade``, ``Expect``), the guard
(exporter/connections.py) writes a response pre-built once per exposition and
second: the same status line, headers and body aiohttp would send, in one write,
for a quarter of aiohttp's CPU per request. The bytes of a request answered here are
remembered (at most 64 different ones), so a scraper's next identical request is
answered without parsing it again. Every other request goes to aiohttp
as before, with its parser's limits and error answers. Not used when a web config
file is given (basic auth and its middleware see every request).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from email.utils import formatdate

from aiohttp.http import SERVER_SOFTWARE

from exporter.server import CONTENT_TYPE, wants_gzip

_REQUEST = re.compile(
    rb"GET /metrics HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}:[ ]*[\x21-\x7e](?:[\x20-\x7e]{0,4096}[\x21-\x7e])?"
    rb"[ ]*\r\n){0,32})\r\n",
)
_FIELD = re.compile(rb"([^:\r\n]+):[ ]*([^\r\n]*?)[ ]*\r\n")
MAX_KNOWN = 64  # distinct requests remembered (each a scraper's exact bytes)
_REFUSED = frozenset(
    {b"content-length", b"transfer-encoding", b"connection", b"upgrade", b"expect"}
)


class FastMetrics:
    """Answers of whole, plain ``GET /metrics`` requests; None for anything else.

    ``exposition`` gives the latest (plain, gzipped) bytes; answers are cached per
    body and second (the Date header), at most one per encoding.
    """

    def __init__(self, exposition: Callable[[], tuple[bytes, bytes]]) -> None:
        self.exposition = exposition
        self._cache: dict[bool, tuple[bytes, int, bytes]] = {}  # gzip -> (body, second, answer)
        self._known: dict[bytes, bool] = {}  # request bytes seen -> gzip, at most MAX_KNOWN
        self.served = 0  # requests answered here (tests and benchmarks read it)

    def __call__(self, data: bytes) -> bytes | None:
        """The whole response to ``data`` (one complete request), or None to let aiohttp
        handle it."""
        gz = self.decide(data)
        return None if gz is None else self.answer(gz)

    def known(self, data: bytes) -> bool | None:
        """Whether ``data`` is a request :meth:`decide` answered before (gzip or not):
        a scraper sends the same bytes every time, so it is parsed once."""
        return self._known.get(data)

    def decide(self, data: bytes) -> bool | None:
        """Whether the answer to ``data`` is gzipped; None when it is not for this path."""
        m = _REQUEST.fullmatch(data)
        if m is None:
            return None
        accept = None
        for name, value in _FIELD.findall(m.group(1)):
            lower = name.lower()
            if lower in _REFUSED:
                return None
            if lower == b"accept-encoding" and accept is None:
                accept = value.decode("ascii")
        gz = bool(accept) and wants_gzip(accept)  # type: ignore[arg-type]
        if len(self._known) >= MAX_KNOWN:  # many different requests: start over
            self._known.clear()
        self._known[data] = gz
        return gz

    def answer(self, gz: bool) -> bytes:
        """Status line, headers and the latest body, gzipped or plain."""
        self.served += 1
        plain, gzipped = self.exposition()
        body = gzipped if gz else plain
        now = int(time.time())
        got = self._cache.get(gz)
        if got is not None and got[0] is body and got[1] == now:
            return got[2]
        head = [
            "HTTP/1.1 200 OK",
            f"Content-Type: {CONTENT_TYPE}",
            *(["Content-Encoding: gzip"] if gz else []),
            f"Content-Length: {len(body)}",
            f"Date: {formatdate(now, usegmt=True)}",
            f"Server: {SERVER_SOFTWARE}",
        ]
        answer = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body
        self._cache[gz] = (body, now, answer)
        return answer
