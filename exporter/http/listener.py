"""The listening sockets, accepted from in small batches and not at all while full.

asyncio's own server accepts up to its listen backlog of sockets per readiness event
before any protocol sees them, so a flood could hold --max-connections + the backlog
descriptors and more. Here each accepted socket is counted by the connection limit
(exporter.http.connections) the moment it is accepted, at most :data:`ACCEPT_BATCH` are
accepted per event, and accepting stops while the exporter holds
``max_connections + ACCEPT_HEADROOM`` sockets (those still closing included). The
rest wait in the kernel's accept queue (:data:`BACKLOG`), which holds no descriptor of
the exporter. So its open descriptors stay within its idle count plus
``max_connections + ACCEPT_HEADROOM``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable

from exporter.runtime.ratelimit import RateLimited

log = logging.getLogger(__name__)

BACKLOG = 1024
"""Connections the kernel queues before the exporter accepts them (listen(); the kernel
caps it at net.core.somaxconn, 4096 by default since Linux 5.4). Queued connections hold
no descriptor of the exporter; a deep queue means a scraper connecting during a flood
waits its turn (milliseconds) instead of having its SYN dropped (a 1 s retransmit)."""
ACCEPT_BATCH = 16
"""Most sockets accepted per readiness event of a listening socket."""
ACCEPT_HEADROOM = 32
"""Sockets the exporter may hold over --max-connections: those told to go, still
closing (an evicted connection sending a response gets the grace to finish it)."""
RETRY_S = 1.0
"""Pause after accept() fails with nothing to close to make room, seconds."""
ROOM_S = 0.05
"""Pause after accept() fails for lack of descriptors or memory and a connection was told
to go to make room (it is closed on the next turn of the event loop), seconds."""
_SHORT_OF = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


FD_SPARE = 64
"""Descriptors the exporter needs besides its connections (files, NVML, kubelet, logs)."""


def raise_fd_limit(max_connections: int) -> None:
    """Raise the soft limit on open files (RLIMIT_NOFILE) to what ``max_connections``
    needs, up to the hard limit, as Go programs do at start; one warning when the hard
    limit is lower (accepting then pauses a second at a time when descriptors run out)."""
    need = max_connections + ACCEPT_HEADROOM + FD_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "--max-connections %d needs %d open files, the limit is %d (ulimit -n): lower "
            "--max-connections or raise the limit",
            max_connections, need, soft,
        )  # fmt: skip


def bind(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for ``host`` (None: every interface, IPv4 and IPv6) and ``port``,
    as asyncio's create_server makes them. Raises socket.gaierror or OSError."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # a family this host lacks (IPv6 off): as create_server does
                continue
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(errno.EAFNOSUPPORT, "no address family of it is supported here")
    return socks


def inherited(fds: tuple[int, ...]) -> list[socket.socket]:
    """The listening sockets systemd passed (--web-systemd-socket), made non-blocking.
    Raises OSError when one is not a listening stream socket."""
    socks = []
    for fd in fds:
        sock = socket.socket(fileno=fd)
        socks.append(sock)
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        ):
            for s in socks:
                s.detach()
            raise OSError(errno.EINVAL, f"file descriptor {fd} is not a listening stream socket")
        sock.setblocking(False)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # as sd_listen_fds(1): not for child processes
    return socks


class Listener:
    """Accepts from ``socks`` into ``admit``, which counts the socket at once and gives
    its protocol (None: close it); ``full`` says when to stop accepting until
    :meth:`resume` is called; ``make_room`` closes a connection when the process runs
    out of descriptors (False: none can go)."""

    def __init__(
        self,
        socks: list[socket.socket],
        admit: Callable[[], asyncio.Protocol | None],
        full: Callable[[], bool],
        forget: Callable[[asyncio.Protocol], None],
        make_room: Callable[[], bool] = lambda: False,
    ) -> None:
        self.socks = socks
        self.admit = admit
        self.full = full
        self.make_room = make_room
        self.forget = forget  # a counted socket whose transport could not be made
        self.paused = False
        self.closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = RateLimited(60.0)
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        self._watch()

    def _watch(self) -> None:
        for sock in self.socks:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch(self) -> None:
        for sock in self.socks:
            self._loop.remove_reader(sock.fileno())

    def pause(self) -> None:
        """Stop accepting; the kernel's queue holds new connections."""
        if not self.paused and not self.closed:
            self.paused = True
            self._unwatch()

    def resume(self) -> None:
        """Accept again (after :meth:`pause`), unless closed or waiting out an error."""
        if self.paused and not self.closed and self._retry is None:
            self.paused = False
            self._watch()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            if self.full():
                self.pause()
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                self._failed(e)
                return
            protocol = self.admit()
            if protocol is None:
                conn.close()
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn, protocol))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket, protocol: asyncio.Protocol) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except Exception:  # reset before its transport was made: nothing to answer
            conn.close()
            self.forget(protocol)

    def _failed(self, e: OSError) -> None:
        short = e.errno in _SHORT_OF
        why = "out of file descriptors or memory" if short else "failed"
        delay = ROOM_S if short and self.make_room() else RETRY_S
        self._log.log(log, logging.WARNING, "accepting connections %s (%s): closing "
                      "connections never answered to make room, or retrying in %g s",
                      why, e.strerror or e, RETRY_S)  # fmt: skip
        self.pause()
        self._retry = self._loop.call_later(delay, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self.resume()

    def close(self) -> None:
        """Stop accepting and close the listening sockets (accepted ones stay)."""
        if self.closed:
            return
        if not self.paused:
            self._unwatch()
        self.closed = True
        if self._retry is not None:
            self._retry.cancel()
        for sock in self.socks:
            sock.close()
