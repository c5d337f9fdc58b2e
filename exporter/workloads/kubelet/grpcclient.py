"""Unary gRPC calls over HTTP/2 cleartext on a unix socket.

The kubelet's pod-resources server is Go gRPC speaking HTTP/2 with prior
knowledge (no TLS, no upgrade). A unary call is one HTTP/2 stream: request
headers, one length-prefixed message, then the answer's headers, one message
and trailers carrying ``grpc-status`` (or, for an error, a trailers-only answer:
``grpc-status`` in its headers). That is all this client does: one connection
(exporter/workloads/kubelet/h2conn.py, h2 underneath), reused across calls and dialled again
once it breaks or the server closes it; one call at a time; every call bounded in
time (the caller's deadline covers connect and call, and goes to the server as
``grpc-timeout``) and in bytes read (``max_message`` plus a small allowance), so a
broken or hostile server can neither stall nor grow the exporter.

grpcio would do the same at 13-15 MiB more RSS, seven threads and about 25 times
the idle CPU of the whole exporter at a 30 s interval (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

from exporter import __version__
from exporter.workloads.kubelet import h2conn
from exporter.workloads.kubelet.h2conn import Broken, Reset

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


def grpc_timeout(seconds: float) -> str:
    """A deadline as the ``grpc-timeout`` header spells it (at most 8 digits and a unit)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms}m" if ms < 10**8 else f"{min(round(seconds), 10**8 - 1)}S"


class _Answer:
    """What arrives on the call's stream: headers, the message's bytes, trailers; ``done``
    resolves when the stream has ended or failed (h2conn.Stream)."""

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.headers: dict[bytes, bytes] = {}
        self.trailers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.length = -1  # the message length its prefix announced
        self.grpc = False  # a 200 answer of content-type application/grpc*
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = dict(headers)
        self.grpc = self.headers.get(b":status") == b"200" and self.headers.get(
            b"content-type", b""
        ).startswith(b"application/grpc")

    def on_data(self, data: bytes) -> None:
        """Take in the payload of one DATA frame; raises on an answer that cannot be
        accepted (a body that is not gRPC is not kept)."""
        if not self.grpc or self.done.done():
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

    def on_trailers(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.trailers = dict(headers)

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def failed(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)

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
        self._conn: h2conn.Connection | None = None
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
        for attempt in (1, 2):
            reused = self._conn is not None and self._conn.usable
            if not reused:
                self._drop()  # closed, or closing (GOAWAY) since the last call
                self._conn = await self._dial()
            conn = self._conn
            assert conn is not None
            answer = _Answer(self.max_message)
            try:
                conn.start(self._headers(path, timeout_s), _message(request), answer, self._budget)
                await answer.done
                return answer.result()
            except Broken as e:
                self._drop()
                # a reused connection may have been closed by the server just before this
                # call: the call never began, ask once more on a fresh one
                if attempt == 2 or e.answered or not (reused or e.unprocessed):
                    raise CallError("UNAVAILABLE", str(e)) from None
            except Reset as e:
                code = RESET_CODES.get(e.code, "INTERNAL")
                raise CallError(code, f"the server reset the call (HTTP/2 error {e})") from None
            finally:
                conn.finish()
        raise AssertionError("unreachable")

    @property
    def _budget(self) -> int:
        return self.max_message + FRAME_ALLOWANCE_BYTES

    async def _dial(self) -> h2conn.Connection:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as e:
            raise CallError(
                "UNAVAILABLE", f"cannot connect to {self.socket_path}: {e.strerror or e}"
            ) from None
        return h2conn.Connection(reader, writer, self._budget, MAX_HEADER_LIST_BYTES)

    def _headers(self, path: str, timeout_s: float) -> list[tuple[bytes, bytes]]:
        return [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", self.authority.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", grpc_timeout(timeout_s).encode()),
            (b"user-agent", USER_AGENT.encode()),
        ]

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    async def close(self) -> None:
        """Close the connection (a later call dials again)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()


def _message(request: bytes) -> bytes:
    """``request`` as gRPC frames one message: uncompressed, its length, its bytes."""
    return b"\0" + len(request).to_bytes(4, "big") + request
