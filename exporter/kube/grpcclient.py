"""Unary gRPC calls over HTTP/2 cleartext on a unix socket, on the pure-Python h2.

The kubelet's pod-resources server is Go gRPC speaking HTTP/2 with prior
knowledge (no TLS, no upgrade). A unary call is one HTTP/2 stream: request
headers, one length-prefixed message, then the answer's headers, one message
and trailers carrying ``grpc-status``. That is all this client does: one
connection, reused across calls and dialled again once it breaks; one call at
a time; every call bounded in time (the caller's deadline covers connect and
call) and in bytes read (``max_message`` plus a small allowance), so a broken
or hostile server can neither stall nor grow the exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from exporter import __version__

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

USER_AGENT = f"gpu-exporter/{__version__} (h2 unary gRPC client)"
MAX_HEADER_LIST_BYTES = 16 * 1024
"""Largest header (and trailer) list accepted (bytes, as HPACK counts them)."""
FRAME_ALLOWANCE_BYTES = 256 * 1024
"""Bytes a call may read besides the answer message: frame headers, HTTP/2 settings and
PINGs, response headers and trailers (a well-behaved answer needs a few KiB)."""
READ_CHUNK = 64 * 1024
DEFAULT_WINDOW = 65_535  # RFC 9113's initial flow-control window, connection and stream


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


class _FrameSizes:
    """Follows frame boundaries in the bytes read, to refuse a frame longer than
    ``limit`` from its 9-byte header (h2 checks only once the whole frame is buffered)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head = b""
        self._skip = 0  # bytes of the current frame's payload still to come

    def check(self, data: bytes) -> None:
        """Take in the next bytes read; raises _Broken at an oversized frame header."""
        pos = 0
        while pos < len(data):
            if self._skip:
                step = min(self._skip, len(data) - pos)
                self._skip -= step
                pos += step
                continue
            take = 9 - len(self._head)
            self._head += data[pos : pos + take]
            pos += take
            if len(self._head) == 9:
                self._skip = int.from_bytes(self._head[:3], "big")
                self._head = b""
                if self._skip > self.limit:
                    raise _Broken(
                        "the server's answer is not valid HTTP/2 (a frame of "
                        f"{self._skip} bytes; at most {self.limit} are accepted)",
                        True,
                    )


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
        self.consumed = 0  # flow-controlled bytes received, handed back after the call

    def on(self, ev: h2.events.Event) -> None:
        """Take in one h2 event; raises on an answer that cannot be accepted."""
        if getattr(ev, "stream_id", self.stream_id) != self.stream_id:
            return  # frames of a stream this client never opened are h2's to refuse
        if isinstance(ev, h2.events.ResponseReceived):
            self.started = True
            self.headers = dict(ev.headers or [])
        elif isinstance(ev, h2.events.DataReceived):
            self.consumed += ev.flow_controlled_length or 0
            if self.headers.get(b":status") == b"200" and self._grpc():
                self._data(ev.data or b"")  # any other body is not gRPC: not kept
        elif isinstance(ev, h2.events.TrailersReceived):
            self.trailers = dict(ev.headers or [])
        elif isinstance(ev, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(ev, h2.events.StreamReset):
            code = RESET_CODES.get(int(ev.error_code or 0), "INTERNAL")
            raise CallError(code, f"the server reset the call (HTTP/2 error {ev.error_code})")
        elif isinstance(ev, h2.events.ConnectionTerminated):
            code = getattr(ev.error_code, "name", str(ev.error_code))
            unprocessed = (ev.last_stream_id or 0) < self.stream_id
            raise _Broken(
                f"the server closed the connection (GOAWAY {code})", self.started, unprocessed
            )

    def _grpc(self) -> bool:
        return self.headers.get(b"content-type", b"").startswith(b"application/grpc")

    def _data(self, data: bytes) -> None:
        self.body += data
        if self.length < 0 and len(self.body) >= 5:
            if self.body[0] != 0:
                raise AnswerInvalid("the answer is compressed; this client asked for none")
            self.length = int.from_bytes(self.body[1:5], "big")
            if self.length > self.max_message:
                raise AnswerTooLarge(self.length)
        if self.length >= 0 and len(self.body) > 5 + self.length:
            raise AnswerInvalid("the answer holds more than one message")

    def result(self) -> bytes:
        """The message; raises CallError or AnswerInvalid."""
        status = self.headers.get(b":status", b"")
        if status != b"200":
            code = HTTP_CODES.get(int(status) if status.isdigit() else 0, "UNKNOWN")
            raise CallError(code, f"HTTP status {status.decode('ascii', 'replace')[:3]}")
        if not self._grpc():
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
        self._conn: h2.connection.H2Connection | None = None
        self._frames = _FrameSizes(0)
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
        if reused and self._reader is not None and self._reader.at_eof():
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
        conn = h2.connection.H2Connection(
            # the request's headers are this module's constants: not checked again per call
            h2.config.H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        conn.initiate_connection()
        conn.update_settings(
            {
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
            }
        )
        # the whole answer fits the windows: it arrives without a wait for WINDOW_UPDATE
        conn.increment_flow_control_window(window - DEFAULT_WINDOW)
        self._conn = conn
        self._frames = _FrameSizes(conn.max_inbound_frame_size)
        self._writer.write(conn.data_to_send())

    async def _exchange(self, path: str, request: bytes, timeout_s: float) -> bytes:
        conn, reader, writer = self._conn, self._reader, self._writer
        assert conn is not None and reader is not None and writer is not None
        sid = conn.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", self.authority.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", grpc_timeout(timeout_s).encode()),
            (b"user-agent", USER_AGENT.encode()),
        ]
        try:
            conn.send_headers(sid, headers)
            conn.send_data(sid, b"\0" + len(request).to_bytes(4, "big") + request, end_stream=True)
        except h2.exceptions.ProtocolError as e:  # e.g. after the server's GOAWAY
            raise _Broken(f"the connection cannot open a call ({type(e).__name__})", False) from e
        answer = _Answer(sid, self.max_message)
        budget = self.max_message + FRAME_ALLOWANCE_BYTES
        await self._send(conn, writer, answer)
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
            self._frames.check(data)
            self._feed(conn, data, answer)
            if not answer.ended:
                await self._send(conn, writer, answer)  # SETTINGS and PING acks
        if answer.consumed:
            # the connection window back to full, in one WINDOW_UPDATE that goes out with
            # the next call's request (one write a call, not two)
            conn.increment_flow_control_window(answer.consumed)
        return answer.result()

    @staticmethod
    async def _send(
        conn: h2.connection.H2Connection, writer: asyncio.StreamWriter, answer: _Answer
    ) -> None:
        if not (out := conn.data_to_send()):
            return
        try:
            writer.write(out)
            await writer.drain()
        except OSError as e:
            why = "the server closed the connection"
            if not isinstance(e, ConnectionError):
                why = f"connection error: {e.strerror or e}"
            raise _Broken(why, answer.started) from None

    @staticmethod
    def _feed(conn: h2.connection.H2Connection, data: bytes, answer: _Answer) -> None:
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            why = str(e)[:80]
            raise _Broken(
                f"the server's answer is not valid HTTP/2 ({type(e).__name__}: {why})", True
            ) from None
        for ev in events:
            answer.on(ev)

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
