"""Every HTTP connection bounded from accept to close, as Go's net/http servers are.

:class:`ConnectionLimit` is the protocol factory for ``loop.create_server``. Each
accepted socket gets a :class:`Guard` in front of aiohttp's request handler, and
counts against the connection limit from accept on, TLS handshake included (the
server does TLS itself, with ``loop.start_tls``, so that a socket in its handshake
can be counted and closed). The guard enforces what aiohttp does not: a deadline
for the TLS handshake, a bound on the total size of a request's headers (431), a
write timeout (a client that stops reading is cut off), and an answer-then-close
for a client that half-closes after its request. aiohttp's keep-alive timer is the
header-read and idle timeout; its parser bounds the request line and each header.

At the limit, a new socket makes room by closing one never answered (oldest first),
and a connection that has been answered (the scraper's keep-alive one) only when no
other is left, then the one idle longest (exporter/http/eviction.py has the rule and what
an attacker can do against it). The listener (exporter/http/listener.py) counts a socket
the moment it accepts it and stops accepting while the sockets held, those closing
included, reach the limit plus its headroom.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from exporter.http import eviction
from exporter.http.headers import HeaderBudget
from exporter.http.tlsstart import start_tls
from exporter.runtime.ratelimit import RateLimited

log = logging.getLogger(__name__)

REFUSED_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 32\r\nConnection: close\r\n\r\nrequest headers are too large.\r\n"
)
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets, dropping unsent data


def reset(transport: asyncio.Transport) -> None:
    """Close at once with a TCP reset: the kernel drops what the client did not read,
    instead of keeping it (up to the send buffer, for minutes) for a client that never
    reads it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: abort() is all there is to do
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection bounds (seconds, bytes) and the connection cap."""

    max_connections: int = 512
    handshake_s: float = 15.0
    write_s: float = 15.0
    max_header_bytes: int = 16384
    grace_s: float = 3.0  # an evicted connection that is sending gets this long to finish


class Guard(asyncio.Protocol):
    """One accepted socket: TLS handshake, header budget, write timeout, half-close."""

    def __init__(self, pool: ConnectionLimit, inner: asyncio.Protocol) -> None:
        self.pool = pool
        self.inner = inner
        self.raw: asyncio.Transport | None = None
        self.connected = False  # inner has its transport (after the handshake, with TLS)
        self.going = False  # told to go (evicted) or gone
        self.budget = HeaderBudget(pool.limits.max_header_bytes)
        self._refused = False  # answered 431: what follows is dropped
        self._write_timer: asyncio.TimerHandle | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._early = bytearray()  # decrypted before start_tls returned: fed after connecting
        self.answered_at: float | None = None  # loop time of the last trusted answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        if self.going:  # evicted between accept and now
            transport.abort()
            return
        if self.pool.tls is None:
            self._connect(transport)
            return
        transport.pause_reading()  # start_tls resumes it, with the ClientHello unread
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls())

    async def _start_tls(self) -> None:
        assert self.raw is not None and self.pool.tls is not None
        try:
            tls = await start_tls(self.raw, self, self.pool.tls, self.pool.limits.handshake_s)
        except asyncio.CancelledError:
            self.raw.abort()
            self.pool.closed(self)
            raise
        except Exception:  # a failed or timed-out handshake: nothing to answer
            self.raw.abort()
            self.pool.closed(self)
            return
        if self.going:
            self.raw.abort()
            self.pool.closed(self)
            return
        self._connect(tls)

    def _connect(self, transport: asyncio.BaseTransport) -> None:
        self.connected = True
        self.inner.connection_made(transport)
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if not self.connected:
            if self._handshake is not None and not self.going:
                self._early += data[: self.pool.limits.max_header_bytes + 1 - len(self._early)]
            return
        if self._refused:
            return
        if not self.budget.feed(data):
            self.pool.too_large += 1
            self.pool.report(
                "request headers over %d bytes: answered 431", self.pool.limits.max_header_bytes
            )
            transport = getattr(self.inner, "transport", None) or self.raw
            if transport is not None:
                transport.write(REFUSED_431)
                transport.close()
            self._refused = True  # the rest of this connection is not parsed
            return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        """The client half-closed: answer what it asked, then close; nothing asked: close."""
        if not self.connected:
            return None
        if self._idle() or self.pool.tls is not None:
            self.inner.force_close()  # type: ignore[attr-defined]
            return None
        self.inner.close()  # type: ignore[attr-defined]  # close after the response
        return True

    def pause_writing(self) -> None:
        if self._write_timer is None:
            loop = asyncio.get_running_loop()
            self._write_timer = loop.call_later(self.pool.limits.write_s, self._write_timeout)
        if self.connected:
            self.inner.pause_writing()
            self._reading(False)  # a client that does not read gets no more requests in

    @property
    def stalled(self) -> bool:
        """Whether the client stopped reading (the send buffer is full)."""
        return self._write_timer is not None

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self.connected:
            self.inner.resume_writing()
            self._reading(True)

    def _reading(self, on: bool) -> None:
        """Pause or resume reading from the client, on the transport aiohttp reads (TLS's
        or the socket's). Resumed only where aiohttp does not hold it paused itself (its
        queue of pipelined requests is full, or a request body waits to be read)."""
        transport = getattr(self.inner, "transport", None)
        if transport is None or transport.is_closing():
            return
        if not on:
            transport.pause_reading()
        elif not any(getattr(self.inner, a, False) for a in ("_reading_paused", "_buffer_paused")):
            transport.resume_reading()

    def _write_timeout(self) -> None:
        self._write_timer = None
        self.pool.write_timeouts += 1
        self.pool.report(
            "a client stopped reading for %g s: connection closed", self.pool.limits.write_s
        )
        if self.raw is not None:
            reset(self.raw)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self.pool.closed(self)
        if self.connected:
            self.connected = False
            self.inner.connection_lost(exc)

    @property
    def busy(self) -> bool:
        """Whether a request is being answered (or queued) on this connection."""
        return self.connected and not self._idle()

    def evict(self) -> None:
        """Make room: a socket in its handshake is dropped; a connection waiting for a
        request, or whose client stopped reading, closes at once; one sending a response
        after it (or grace_s)."""
        self.going = True
        if not self.connected:
            if self._handshake is not None:
                self._handshake.cancel()
            if self.raw is not None:
                self.raw.abort()  # also when the handshake task never got to run
            # else accepted, not yet set up: connection_made aborts it (still counted:
            # its descriptor is open until then)
            return
        if self._idle():  # waiting for (the rest of) a request: nothing to finish
            self.inner.force_close()  # type: ignore[attr-defined]
            return
        if self.stalled and self.raw is not None:  # not reading: a grace would not help
            reset(self.raw)
            return
        self.inner.close()  # type: ignore[attr-defined]
        shutdown = self.inner.shutdown(self.pool.limits.grace_s)  # type: ignore[attr-defined]
        self.pool.spawn(shutdown)

    def _idle(self) -> bool:
        """Whether aiohttp's handler waits for a request, with none queued or running."""
        waiter = getattr(self.inner, "_waiter", None)
        queued = getattr(self.inner, "_messages", None)
        return waiter is not None and not waiter.done() and not queued


class _Refused(asyncio.Protocol):
    """Closes a connection as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class ConnectionLimit:
    """Protocol factory: aiohttp's server behind a :class:`Guard` per socket, at most
    ``limits.max_connections`` of them. At the limit a new socket makes another leave
    (:meth:`Guard.evict`), chosen by exporter/http/eviction.py: never-answered connections
    first (oldest first), answered ones (the scraper's keep-alive) only when no other
    is left. So a flood of idle, half-open or handshaking connections cannot lock a
    scraper out; only when every open one is already going is the new one refused. The
    :class:`~exporter.http.listener.Listener` asks :meth:`full` before each accept, so that
    sockets still closing stay within ``headroom`` over the limit."""

    def __init__(
        self,
        server: web.Server,
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        headroom: int = 32,
    ) -> None:
        self.server = server
        self.limits = limits
        self.tls = tls
        self.headroom = headroom
        self.open: dict[Guard, None] = {}  # insertion order: oldest first
        self.evicted = self.refused = self.too_large = self.write_timeouts = 0
        self.on_room: Callable[[], None] | None = None  # called when no longer full
        self._tasks: set[asyncio.Task[None]] = set()
        self._logs: dict[str, RateLimited] = {}
        self.closing = False  # close_all() was called: sockets accepted from now on go

    def __call__(self) -> asyncio.BaseProtocol:
        return self.admit() or _Refused()

    def admit(self) -> Guard | None:
        """A Guard for a socket just accepted, counted from now on (making room first);
        None when it must be closed: shutting down, or every open one already going."""
        if self.closing:
            return None
        if len(self.open) >= self.limits.max_connections:
            live = len(self.open) - sum(g.going for g in self.open)
            while live >= self.limits.max_connections:
                if not self.make_room():
                    self.refused += 1
                    self._full()
                    return None
                live -= 1
            self._full()
        guard = Guard(self, self.server())
        self.open[guard] = None  # counted from accept on, before asyncio calls connection_made
        return guard

    def make_room(self) -> bool:
        """Tell one connection to go (exporter/http/eviction.py chooses), at the limit or when
        the process has no descriptor left; False when every one is already going."""
        victim = eviction.victim(self.open)
        if victim is None:
            return False
        victim.evict()
        self.evicted += 1
        return True

    def full(self) -> bool:
        """Whether the sockets held (those going included) leave no room to accept."""
        return len(self.open) >= self.limits.max_connections + self.headroom

    def closed(self, guard: Guard) -> None:
        guard.going = True
        counted = guard in self.open
        self.open.pop(guard, None)
        if counted and self.on_room is not None and not self.full():
            self.on_room()  # the listener accepts again (after pausing when full)

    def forget(self, protocol: asyncio.Protocol) -> None:
        """A socket counted by :meth:`admit` whose transport was never made."""
        if isinstance(protocol, Guard):
            self.closed(protocol)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def report(self, msg: str, *args: object) -> None:
        self._logs.setdefault(msg, RateLimited(60.0)).log(log, logging.WARNING, msg, *args)

    def _full(self) -> None:
        self.report(
            "%d HTTP connections open, the limit is %d (--max-connections): closing "
            "never-answered ones first, oldest first (%d so far), refusing new ones when "
            "all are closing (%d so far)",
            len(self.open),
            self.limits.max_connections,
            self.evicted,
            self.refused,
        )

    def close_all(self) -> None:
        """On shutdown: drop every socket still in its handshake or not reading its
        response, so that they cannot delay the exit. A socket accepted but not yet
        handed to its protocol goes when it is: aiohttp would otherwise see it only after
        closing its idle connections and wait its whole shutdown timeout for a request."""
        self.closing = True
        for guard in list(self.open):
            if guard.raw is None:
                guard.going = True  # connection_made aborts it
            elif not guard.connected:
                guard.raw.abort()
            elif guard.stalled:
                reset(guard.raw)
