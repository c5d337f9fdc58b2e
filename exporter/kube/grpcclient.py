"""Unary gRPC calls over HTTP/2 cleartext on a unix socket.

The kubelet's pod-resources server is Go gRPC speaking HTTP/2 with prior
knowledge (no TLS, no upgrade). A unary call is one HTTP/2 stream: request
headers, one length-prefixed message, then the answer's headers, one message
and trailers carrying ``grpc-status``. That is all this client does: one
connection, reused across calls and dialled again once it breaks; one call at
a time; every call bounded in time (the caller's deadline covers connect and
call) and in bytes read (``max_message`` plus a small allowance), so a broken
or hostile server can neither stall nor grow the exporter.

HTTP/2 is framed by exporter/kube/http2.py; this module adds gRPC's meaning
(status, trailers, the length-prefixed message), the socket and the deadline.
An answer this client cannot take ends the connection with one reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import unquote

from exporter import __version__
from exporter.kube import http2

CODES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""gRPC status code names by number, as gRPC spells them."""

# An answer that is not gRPC at all, by HTTP status: the codes gRPC's own clients report
# (gRPC's "HTTP to gRPC Status Code Mapping"); any other status is UNKNOWN.
HTTP_CODES = {
    400: "INTERNAL",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "UNIMPLEMENTED",
    429: "UNAVAILABLE",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "UNAVAILABLE",
}

# RST_STREAM error codes (RFC 9113) whose gRPC meaning is not INTERNAL
RESET_CODES = {7: "UNAVAILABLE", 8: "CANCELLED", 11: "RESOURCE_EXHAUSTED", 12: "PERMISSION_DENIED"}

USER_AGENT = f"gpu-exporter/{__version__} (unary gRPC client)"
MAX_HEADER_LIST_BYTES = 16 * 1024
"""Largest header (and trailer) list accepted (bytes, as HPACK counts them)."""
FRAME_ALLOWANCE_BYTES = 256 * 1024
"""Bytes a call may read besides the answer message: frame headers, HTTP/2 settings and
PINGs, response headers and trailers (a well-behaved answer needs a few KiB)."""
READ_CHUNK = 64 * 1024


class CallError(Exception):
    """A call that failed, with its gRPC status code name and details."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class AnswerTooLarge(Exception):
    """The answer's message announced more than ``max_message`` bytes (it was not read)."""


class AnswerInvalid(Exception):
    """The answer is well-formed HTTP/2 but not exactly one uncompressed gRPC message."""


class _Broken(Exception):
    """The connection cannot carry this call. ``answered``: the server began to answer;
    ``unprocessed``: the server said (GOAWAY) that it did not look at the call."""

    def __init__(self, why: str, answered: bool, unprocessed: bool = False) -> None:
        super().__init__(why)
        self.answered = answered
        self.unprocessed = unprocessed


def grpc_timeout(seconds: float) -> str:
    """A deadline as the ``grpc-timeout`` header spells it (at most 8 digits and a unit)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms}m" if ms < 10**8 else f"{min(round(seconds), 10**8 - 1)}S"


class _Answer:
    """What arrived on one stream: headers, the message's bytes, trailers."""

    def __init__(self, stream_id: int, max_message: int) -> None:
        self.stream_id = stream_id
        self.max_message = max_message
        self.headers: dict[bytes, bytes] = {}
        self.trailers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.length = -1  # the message length its prefix announced
        self.started = False
        self.ended = False
        self.grpc = False  # a 200 answer of content-type application/grpc*
        self.closing = False  # a GOAWAY arrived: the next call dials again

    def header_list(self, fields: list[Any], end_stream: bool) -> None:
        """Take in a decoded header list: the answer's headers, then its trailers."""
        pseudo = [(k, v) for k, v in fields if k[:1] == b":"]
        if any(k != k.lower() for k, _ in fields):
            raise http2.Invalid("a header name in upper case")
        if not self.started:
            if pseudo != fields[: len(pseudo)] or [k for k, _ in pseudo] != [b":status"]:
                raise http2.Invalid("the answer's headers need exactly one :status, first")
            status = pseudo[0][1]
            if len(status) != 3 or not status.isdigit():
                raise http2.Invalid("a :status that is not three digits")
            if status[:1] == b"1":
                if end_stream:
                    raise http2.Invalid("an informational answer that ends the stream")
                return  # informational (1xx): the answer's headers are still to come
            self.started = True
            self.headers = dict(fields)
            self.grpc = status == b"200" and self.headers.get(b"content-type", b"").startswith(
                b"application/grpc"
            )
        elif self.trailers or not end_stream:
            raise http2.Invalid("a header block after the answer's headers that does not end it")
        elif pseudo:
            raise http2.Invalid("a pseudo-header in the trailers")
        else:
            self.trailers = dict(fields)
        self.ended = end_stream

    def data(self, data: bytes, end_stream: bool) -> None:
        """Take in the payload of one DATA frame; raises on an answer that cannot be
        accepted (a body that is not gRPC is not kept)."""
        if not self.started or self.trailers:
            raise http2.Invalid("DATA outside the answer's body")
        self.ended = end_stream
        if not self.grpc:
            return
        self.body += data
        if self.length < 0 and len(self.body) >= 5:
            if self.body[0] != 0:
                raise AnswerInvalid("the answer is compressed; this client asked for none")
            self.length = int.from_bytes(self.body[1:5], "big")
            if self.length > self.max_message:
                raise AnswerTooLarge(self.length)
        if self.length >= 0 and len(self.body) > 5 + self.length:
            raise AnswerInvalid("the answer holds more than one message")

    def reset(self, code: int) -> None:
        """The server reset the call's stream (RST_STREAM)."""
        raise CallError(
            RESET_CODES.get(code, "INTERNAL"),
            f"the server reset the call (HTTP/2 error {http2.error_name(code)})",
        )

    def goaway(self, last_stream_id: int, code: int) -> None:
        """The server is closing the connection (GOAWAY); an answer already whole is kept."""
        self.closing = True
        if not self.ended:
            why = f"the server closed the connection (GOAWAY {http2.error_name(code)})"
            raise _Broken(why, self.started, last_stream_id < self.stream_id)

    def result(self) -> bytes:
        """The message; raises CallError or AnswerInvalid."""
        status = self.headers.get(b":status", b"")
        if status != b"200":
            code = HTTP_CODES.get(int(status) if status.isdigit() else 0, "UNKNOWN")
            raise CallError(code, f"HTTP status {status.decode('ascii', 'replace')[:3]}")
        if not self.grpc:
            ctype = self.headers.get(b"content-type", b"")[:60]
            raise CallError("UNKNOWN", f"content-type {ctype!r} is not application/grpc")
        meta = self.trailers or self.headers  # a trailers-only answer has them in its headers
        raw = meta.get(b"grpc-status", b"")
        if not raw.isdigit():
            raise CallError("UNKNOWN", "the answer carries no grpc-status")
        number = int(raw)
        if number != 0:
            message = unquote(meta.get(b"grpc-message", b"").decode("utf-8", "replace"))
            raise CallError(CODES[number] if number < len(CODES) else "UNKNOWN", message)
        if self.length < 0 or len(self.body) != 5 + self.length:
            raise AnswerInvalid("the answer holds no complete message")
        return bytes(self.body[5:])


class Channel:
    """Unary calls to one gRPC server on a unix socket, one connection reused."""

    def __init__(self, socket_path: str, max_message: int, authority: str = "localhost") -> None:
        self.socket_path = socket_path
        self.max_message = max_message
        self.authority = authority
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn: http2.ClientConnection | None = None
        self._blocks: dict[tuple[str, str], bytes] = {}  # request header blocks by path, timeout
        self._lock = asyncio.Lock()

    async def call(self, path: str, request: bytes, timeout_s: float) -> bytes:
        """The answer message to ``request`` at ``path`` within ``timeout_s`` seconds
        (connect included); raises CallError, AnswerTooLarge or AnswerInvalid."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self._call(path, request, timeout_s)
            except TimeoutError:
                self._drop()
                raise CallError("DEADLINE_EXCEEDED", f"no answer within {timeout_s:g} s") from None
            except (AnswerTooLarge, AnswerInvalid):
                self._drop()  # the rest of the stream is not read: start afresh
                raise
            except CallError:
                raise  # the call ended (a gRPC status, a reset) or the connection is gone
            except BaseException:  # cancelled mid-call: the connection is in an unknown state
                self._drop()
                raise

    async def _call(self, path: str, request: bytes, timeout_s: float) -> bytes:
        reused = self._conn is not None
        if self._conn is not None and (
            self._conn.exhausted or (self._reader is not None and self._reader.at_eof())
        ):
            self._drop()  # the server closed the idle connection since the last call
            reused = False
        for attempt in (1, 2):
            if self._conn is None:
                await self._dial()
            try:
                return await self._exchange(path, request, timeout_s)
            except _Broken as e:
                self._drop()
                # a reused connection may have been closed by the server just before this
                # call: the call never began, ask once more on a fresh one
                if attempt == 2 or e.answered or not (reused or e.unprocessed):
                    raise CallError("UNAVAILABLE", str(e)) from None
        raise AssertionError("unreachable")

    async def _dial(self) -> None:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as e:
            raise CallError(
                "UNAVAILABLE", f"cannot connect to {self.socket_path}: {e.strerror or e}"
            ) from None
        window = self.max_message + FRAME_ALLOWANCE_BYTES
        self._conn = http2.ClientConnection(window, MAX_HEADER_LIST_BYTES)
        self._writer.write(self._conn.preface())

    def _request(self, path: str, timeout_s: float) -> bytes:
        """The request's header block (kept: the same path and deadline, the same bytes)."""
        key = (path, grpc_timeout(timeout_s))
        if (block := self._blocks.get(key)) is None:
            if len(self._blocks) >= 8:
                self._blocks.clear()
            block = self._blocks[key] = http2.header_block(
                [
                    (b":method", b"POST"),
                    (b":scheme", b"http"),
                    (b":path", path.encode()),
                    (b":authority", self.authority.encode()),
                    (b"content-type", b"application/grpc"),
                    (b"te", b"trailers"),
                    (b"grpc-timeout", key[1].encode()),
                    (b"user-agent", USER_AGENT.encode()),
                ]
            )
        return block

    async def _exchange(self, path: str, request: bytes, timeout_s: float) -> bytes:
        conn, reader, writer = self._conn, self._reader, self._writer
        assert conn is not None and reader is not None and writer is not None
        message = b"\0" + len(request).to_bytes(4, "big") + request
        sid, out = conn.request(self._request(path, timeout_s), message)
        answer = _Answer(sid, self.max_message)
        await self._write(writer, out, answer)
        budget = self.max_message + FRAME_ALLOWANCE_BYTES
        while not answer.ended:
            data = await reader.read(min(READ_CHUNK, budget + 1))
            if not data:
                raise _Broken("the server closed the connection", answer.started)
            budget -= len(data)
            if budget < 0:
                raise _Broken(
                    f"the server sent more than {self.max_message + FRAME_ALLOWANCE_BYTES} "
                    "bytes for one call",
                    True,
                )
            try:
                replies = conn.receive(data, answer)
            except http2.Invalid as e:
                raise _Broken(f"the server's answer is not valid HTTP/2 ({e})", True) from None
            if replies:
                await self._write(writer, replies, answer)  # SETTINGS and PING acks
        if answer.closing:
            self._drop()  # after a GOAWAY: the next call dials again
        return answer.result()

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, data: bytes, answer: _Answer) -> None:
        try:
            writer.write(data)
            await writer.drain()
        except OSError as e:
            why = "the server closed the connection"
            if not isinstance(e, ConnectionError):
                why = f"connection error: {e.strerror or e}"
            raise _Broken(why, answer.started) from None

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._conn = None

    async def close(self) -> None:
        """Close the connection (a later call dials again)."""
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
