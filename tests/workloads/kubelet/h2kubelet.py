"""A scripted kubelet at the HTTP/2 level: a unix-socket server on the test's event loop
that answers each connection with a script, raw bytes or frames made with h2's server
side, so that the client can be tried against answers no real gRPC server sends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events


class Peer:
    """One accepted connection: an h2 server connection over the socket's streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.conn.initiate_connection()
        self.requests: list[dict[bytes, bytes]] = []
        self.ping_acks: list[bytes] = []  # the payloads of the PING acks the client sent
        self.ended: list[int] = []  # streams whose request has fully arrived, not yet served

    async def flush(self) -> None:
        """Send what h2 has queued."""
        if out := self.conn.data_to_send():
            self.writer.write(out)
            await self.writer.drain()

    async def raw(self, data: bytes) -> None:
        """Send bytes as they are."""
        self.writer.write(data)
        await self.writer.drain()

    async def read(self) -> bool:
        """Read and take in what the client sent next (acks and requests are noted);
        False at end of file (or once the client has closed and a write found it gone)."""
        try:
            data = await self.reader.read(65536)
        except ConnectionError:
            return False
        if not data:
            return False
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                self.requests.append(dict(ev.headers))  # type: ignore[arg-type]
            if isinstance(ev, h2.events.PingAckReceived):
                self.ping_acks.append(ev.ping_data or b"")
            if isinstance(ev, h2.events.StreamEnded):
                self.ended.append(ev.stream_id)
        await self.flush()
        return True

    async def request(self) -> int | None:
        """Read until a request has fully arrived; its stream id, or None at EOF."""
        while not self.ended:
            if not await self.read():
                return None
        return self.ended.pop(0)

    async def until_eof(self) -> None:
        """Read (and answer PINGs and SETTINGS) until the client closes the connection."""
        while await self.read():
            pass

    async def answer(
        self, sid: int, body: bytes, trailers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """A gRPC answer: headers, ``body`` as it is (framed by the caller) in frames the
        client's windows allow, trailers (grpc-status 0 unless given)."""
        self.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        while body:
            size = min(
                len(body),
                self.conn.local_flow_control_window(sid),
                self.conn.max_outbound_frame_size,
            )
            assert size > 0, "the client's flow-control window is closed"
            self.conn.send_data(sid, body[:size])
            body = body[size:]
            await self.flush()
        self.conn.send_headers(sid, trailers or [(b"grpc-status", b"0")], end_stream=True)
        await self.flush()


def message(payload: bytes, compressed: int = 0) -> bytes:
    """A gRPC length-prefixed message."""
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


# Frame types and flags (RFC 9113 section 6), for frames written as raw bytes
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame as bytes: the 9-byte header (RFC 9113 section 4.1), then ``payload``
    (any payload: the frames a broken server sends are written this way too)."""
    head = len(payload).to_bytes(3, "big") + bytes((kind, flags))
    return head + stream_id.to_bytes(4, "big") + payload


def literal_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block any HPACK decoder takes as it is, whatever its table holds: each field
    a literal never indexed, its strings plain (RFC 7541 section 6.2.3); names and values
    under 127 bytes."""
    out = bytearray()
    for name, value in headers:
        assert len(name) < 127 and len(value) < 127
        out += b"\x10" + bytes((len(name),)) + name + bytes((len(value),)) + value
    return bytes(out)


Script = Callable[[Peer], Awaitable[None]]


class H2Kubelet:
    """Serves each accepted connection with ``script``; counts connections."""

    def __init__(self, socket_path: Path, script: Script) -> None:
        self.socket_path = socket_path
        self.script = script
        self.connections = 0
        self.peers: list[Peer] = []
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> H2Kubelet:
        self._server = await asyncio.start_unix_server(self._serve, str(self.socket_path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for p in self.peers:
            p.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = Peer(reader, writer)
        self.peers.append(peer)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await self.script(peer)
