"""The client side of HTTP/2 (RFC 9113) for one stream at a time, as bytes in and out.

:class:`ClientConnection` makes the frames of a request and takes in what a server
sends, frame by frame, handing the call's headers, data, reset or GOAWAY to a
:class:`Stream` and returning the acknowledgements owed to the server; it does no
I/O. A general HTTP/2 library spends most of a call's CPU on state that one
unary call at a time never needs. Header blocks are decoded by ``hpack``
(RFC 7541: the server's compression context lasts across calls); the request's
block indexes nothing, so the same bytes serve every call. Every frame's length is
checked from its 9-byte header, before its payload is waited for; a frame against
the protocol raises :class:`Invalid`.
"""

from __future__ import annotations

from typing import Any, Protocol

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_FRAME_BYTES = 16_384  # RFC 9113's initial SETTINGS_MAX_FRAME_SIZE; this client asks no more
MAX_STREAM_ID = 2**31 - 1
DEFAULT_WINDOW = 65_535  # RFC 9113's initial flow-control window, connection and stream

# Frame types and flags (RFC 9113 section 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
CONTROL = (SETTINGS, PING, GOAWAY)  # the frames that belong on stream 0, and only there

# SETTINGS identifiers
ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 2, 4, 5, 6

ERROR_NAMES = (
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
)
"""HTTP/2 error code names by number (RFC 9113 section 7)."""


class Invalid(Exception):
    """The server broke HTTP/2 (or HPACK): why, in a few words."""


class Stream(Protocol):
    """The receiving end of the one open stream."""

    stream_id: int
    ended: bool  # END_STREAM has arrived

    def header_list(self, fields: list[Any], end_stream: bool) -> None: ...
    def data(self, data: bytes, end_stream: bool) -> None: ...
    def reset(self, code: int) -> None: ...
    def goaway(self, last_stream_id: int, code: int) -> None: ...


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: the 9-byte header, then ``payload``."""
    head = len(payload).to_bytes(3, "big") + bytes((kind, flags))
    return head + stream_id.to_bytes(4, "big") + payload


def error_name(code: int) -> str:
    """An HTTP/2 error code as RFC 9113 names it."""
    return ERROR_NAMES[code] if code < len(ERROR_NAMES) else f"error {code}"


def _hpack_int(value: int) -> bytes:
    """A string length as HPACK writes it (RFC 7541 section 5.1, 7-bit prefix, no Huffman)."""
    if value < 127:
        return bytes((value,))
    out = bytearray((127,))
    value -= 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block that leaves the server's decoder state as it was: a dynamic table
    size update to 0, then each field as a literal never indexed (RFC 7541 sections 6.2.3,
    6.3), its strings plain. The same bytes are valid on any connection, in any order."""
    out = bytearray(b"\x20")
    for name, value in headers:
        out += b"\x10" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value
    return bytes(out)


class ClientConnection:
    """Framing state of one client connection that opens one stream at a time.

    ``window``: the flow-control window offered for the connection and each stream (a
    whole answer fits it, so none waits for WINDOW_UPDATE; what arrives is handed back
    with the next request). ``max_header_list``: the largest header block taken in
    (bytes, as sent and as HPACK counts them once decoded).
    """

    def __init__(self, window: int, max_header_list: int) -> None:
        self.window = window
        self.max_header_list = max_header_list
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list
        self.next_stream = 1
        self._buf = bytearray()  # bytes read that do not yet make a whole frame
        self._block: tuple[int, bool, bytearray] | None = None  # (stream, ends it, block)
        self._settled = False  # the server's connection preface (a SETTINGS frame) arrived
        self._returned = 0  # flow-controlled bytes received, handed back with the next request
        self._owed = b""  # acks that arrived with the end of an answer, for the next write

    @property
    def exhausted(self) -> bool:
        """True once no stream ID is left: dial again."""
        return self.next_stream > MAX_STREAM_ID

    def preface(self) -> bytes:
        """The client's connection preface: the magic, SETTINGS and the window."""
        settings = (
            (ENABLE_PUSH, 0),
            (INITIAL_WINDOW_SIZE, self.window),
            (MAX_HEADER_LIST_SIZE, self.max_header_list),
        )
        payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in settings)
        out = PREFACE + frame(SETTINGS, 0, 0, payload)
        if self.window > DEFAULT_WINDOW:
            out += frame(WINDOW_UPDATE, 0, 0, (self.window - DEFAULT_WINDOW).to_bytes(4, "big"))
        return out

    def request(self, block: bytes, body: bytes) -> tuple[int, bytes]:
        """(stream ID, bytes to send) of a request of one header block and one DATA frame
        (both within the smallest frame size), after what is owed to the server."""
        sid = self.next_stream
        self.next_stream += 2
        out, self._owed = self._owed, b""
        if self._returned:  # the connection window back to full
            out += frame(WINDOW_UPDATE, 0, 0, self._returned.to_bytes(4, "big"))
            self._returned = 0
        out += frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, body)
        return sid, out

    def receive(self, data: bytes, stream: Stream) -> bytes:
        """Take in the bytes read; the acks to send now (those owed once the stream has
        ended go out with the next request)."""
        buf, pos, replies = self._buf, 0, b""
        buf += data
        try:
            while len(buf) - pos >= 9:
                length = int.from_bytes(buf[pos : pos + 3], "big")
                if length > MAX_FRAME_BYTES:
                    raise Invalid(
                        f"a frame of {length} bytes; at most {MAX_FRAME_BYTES} are accepted"
                    )
                if len(buf) - pos < 9 + length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & MAX_STREAM_ID
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                replies += self._frame(kind, flags, sid, payload, stream)
        finally:
            del buf[:pos]
        if stream.ended:
            self._owed += replies
            return b""
        return replies

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes, stream: Stream) -> bytes:
        if self._block is not None and kind != CONTINUATION:
            raise Invalid("a header block cut by another frame")
        if not self._settled:
            if kind != SETTINGS or flags & ACK:
                raise Invalid("the server did not begin with SETTINGS")
            self._settled = True
        if (kind in CONTROL) != (sid == 0) and kind < WINDOW_UPDATE:
            raise Invalid(f"a frame of type {kind} on stream {sid}")
        if kind == GOAWAY:
            if len(payload) < 8:
                raise Invalid("a GOAWAY frame of fewer than 8 bytes")
            last = int.from_bytes(payload[:4], "big") & MAX_STREAM_ID
            stream.goaway(last, int.from_bytes(payload[4:8], "big"))
        elif kind in (DATA, HEADERS, CONTINUATION, RST_STREAM):
            self._stream_frame(kind, flags, sid, payload, stream)
        else:
            return _connection_frame(kind, flags, payload)
        return b""

    def _stream_frame(
        self, kind: int, flags: int, sid: int, payload: bytes, stream: Stream
    ) -> None:
        if kind == DATA:
            self._returned += len(payload)  # padding included, as flow control counts
            if self._current(sid, stream):
                stream.data(_unpad(flags, payload), bool(flags & END_STREAM))
        elif kind == HEADERS:
            block = _unpad(flags, payload)[5 if flags & PRIORITY_FLAG else 0 :]
            self._block = (sid, bool(flags & END_STREAM), bytearray(block))
            self._header_block(flags, stream)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != sid:
                raise Invalid("CONTINUATION outside a header block")
            self._block[2].extend(payload)
            self._header_block(flags, stream)
        else:  # RST_STREAM
            if len(payload) != 4:
                raise Invalid("a RST_STREAM frame that is not 4 bytes")
            if self._current(sid, stream):
                stream.reset(int.from_bytes(payload, "big"))

    def _current(self, sid: int, stream: Stream) -> bool:
        """True for a frame of the open stream until it ends; False for a late frame of a
        stream that has ended (this call's, e.g. a RST_STREAM after the trailers, or an
        earlier call's): ignored; a stream this client never opened is invalid."""
        if sid == stream.stream_id:
            return not stream.ended
        if sid % 2 == 0 or sid > stream.stream_id:
            raise Invalid(f"a frame on stream {sid}, which this client did not open")
        return False

    def _header_block(self, flags: int, stream: Stream) -> None:
        assert self._block is not None
        sid, end_stream, block = self._block
        if len(block) > self.max_header_list:
            raise Invalid(f"a header block of more than {self.max_header_list} bytes")
        if not flags & END_HEADERS:
            return
        self._block = None
        current = self._current(sid, stream)
        try:  # every block is decoded: the server's compression context depends on it
            fields = list(self.decoder.decode(bytes(block), raw=True))
        except hpack.HPACKError as e:
            raise Invalid(f"headers that do not decode: {type(e).__name__}") from None
        if current:
            stream.header_list(fields, end_stream)


def _unpad(flags: int, payload: bytes) -> bytes:
    """The payload of a DATA or HEADERS frame without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise Invalid("padding as long as its frame")
    return payload[1 : len(payload) - payload[0]]


def _connection_frame(kind: int, flags: int, payload: bytes) -> bytes:
    """The reply to a SETTINGS, PING, WINDOW_UPDATE, PRIORITY or PUSH_PROMISE frame, or
    to one of a type this client does not know (none: ignored, as RFC 9113 says)."""
    if kind == SETTINGS:
        return _settings(flags, payload)
    if kind == PING:
        if len(payload) != 8:
            raise Invalid("a PING frame that is not 8 bytes")
        return b"" if flags & ACK else frame(PING, ACK, 0, payload)
    if kind == WINDOW_UPDATE:
        if len(payload) != 4 or not int.from_bytes(payload, "big") & MAX_STREAM_ID:
            raise Invalid("a WINDOW_UPDATE frame that is not 4 bytes or adds nothing")
    elif kind == PRIORITY:
        if len(payload) != 5:
            raise Invalid("a PRIORITY frame that is not 5 bytes")
    elif kind == PUSH_PROMISE:
        raise Invalid("PUSH_PROMISE, which this client turned off")
    return b""


def _settings(flags: int, payload: bytes) -> bytes:
    """The acknowledgement a SETTINGS frame calls for, once its values are checked (a
    client that sends one small request per call needs none of them)."""
    if flags & ACK:
        if payload:
            raise Invalid("a SETTINGS acknowledgement with a payload")
        return b""
    if len(payload) % 6:
        raise Invalid("a SETTINGS frame whose length is not a multiple of 6")
    for i in range(0, len(payload), 6):
        ident = int.from_bytes(payload[i : i + 2], "big")
        value = int.from_bytes(payload[i + 2 : i + 6], "big")
        if (
            (ident == ENABLE_PUSH and value > 1)
            or (ident == INITIAL_WINDOW_SIZE and value > MAX_STREAM_ID)
            or (ident == MAX_FRAME_SIZE and not MAX_FRAME_BYTES <= value < 2**24)
        ):
            raise Invalid(f"SETTINGS {ident} = {value}, outside its range")
    return frame(SETTINGS, ACK, 0)
