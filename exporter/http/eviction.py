"""Which connection makes room when a new socket arrives at --max-connections.

A connection earns trust by being answered: a response with a status under 400 to a
request that passed basic auth (or any request, without a web config). The rule, in
order:

1. a connection never answered (still in its TLS handshake, silent, or sending its
   first request's headers), oldest first; then, oldest first, one whose first
   request is being answered (it gets the response grace to finish) or whose client
   stopped reading (closed at once: an answer it does not read earns nothing);
2. only when every other connection has been answered: the one idle the longest
   since its last answer, then one sending a response.

So a flood of idle, half-open or handshaking sockets evicts itself, never the
scraper's keep-alive connection. An attacker who completes requests (possible only
without basic auth, or with the password) competes with the scraper: its answered
connections still count against the cap, are still closed by the idle timeout
(--http-timeout), and the one idle longest goes first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol, TypeVar

from aiohttp import web

from exporter.http.routes import SOURCE


class Candidate(Protocol):
    """What the policy reads of a connection (exporter.http.connections.Guard)."""

    going: bool  # told to go already
    answered_at: float | None  # loop time of the last trusted answer; None: never

    @property
    def busy(self) -> bool:
        """Whether a request is being answered on it."""
        ...

    @property
    def stalled(self) -> bool:
        """Whether its client stopped reading a response."""
        ...


C = TypeVar("C", bound=Candidate)


def victim(open_: Iterable[C]) -> C | None:
    """The connection to close, from ``open_`` in accept order (oldest first); None when
    every one is already going."""
    first_busy: C | None = None
    best: C | None = None
    best_key = (True, 0.0)
    for c in open_:
        if c.going:
            continue
        if c.answered_at is None or c.stalled:
            if not c.busy and not c.stalled:
                return c
            first_busy = first_busy or c
            continue
        key = (c.busy, c.answered_at)
        if best is None or key < best_key:
            best, best_key = c, key
    return first_busy or best


async def note_response(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp ``on_response_prepare`` hook: a response under 400 to an authenticated
    request marks its connection as answered (trusted, see the module docstring)."""
    transport = request.transport
    guard = transport.get_protocol() if transport is not None else None
    if not hasattr(guard, "answered_at") or response.status >= 400:
        return
    source = request.app.get(SOURCE)
    if source is not None and not source.authenticated(request):
        return
    guard.answered_at = asyncio.get_running_loop().time()  # type: ignore[union-attr]
