"""One HTTP/2 client connection on a unix socket: h2 for the protocol, a task to read it.

h2 (python-hyper, sans-IO) does HTTP/2: frames, HPACK, flow control, and the
acknowledgements of SETTINGS and PING. This module adds the socket, a reader task
that runs for the connection's life (so that a PING or GOAWAY sent between two
calls is answered at once, not at the next call), one stream at a time handed to
a :class:`Stream`, and bounds on what the server may send: bytes and frames per
call and between calls, read 16 KiB at a time with other tasks let in between,
header list size and frame size (h2's, the latter checked at the frame's header),
and the first frame (SETTINGS, as RFC 9113 section 3.4 requires).

h2 moves a connection to CLOSED as soon as a GOAWAY arrives (python-hyper/h2
issue 1181), which would fail the stream in flight. RFC 9113 section 6.8 lets the
streams up to the GOAWAY's last-stream-id finish, and gRPC servers shut down that
way (grpc-go's GracefulStop: GOAWAY with last-stream-id 2^31-1, a PING, a final
GOAWAY, then the close once no stream is left), so :class:`_H2Connection` keeps
the connection open for them; a connection that received a GOAWAY starts no
stream and is closed once its stream has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings

READ_CHUNK = 16 * 1024
"""Bytes read at a time: at most 1,820 frames, which h2 takes in within about 20 ms (an
empty SETTINGS or PING frame costs it about 10 us), so a flood of small frames never
holds the event loop longer than that at once."""
IDLE_BYTES = 64 * 1024
"""Bytes the server may send while no call is in flight (PINGs, SETTINGS, a GOAWAY, late
frames of the last answer); past it the connection is closed and the next call dials."""
CALL_EVENTS = 20_000
"""What h2 may report (about one event per frame) while a call is in flight: a 4 MiB answer
in 16 KiB DATA frames is about 260; past it the connection is closed, so that a flood of
control frames costs at most about 0.2 s of CPU per call."""
IDLE_EVENTS = 1_000
"""The same while no call is in flight."""


class Broken(Exception):
    """The connection cannot carry the call. ``answered``: the server began to answer;
    ``unprocessed``: the server said (GOAWAY) that it did not look at the call."""

    def __init__(self, why: str, answered: bool, unprocessed: bool = False) -> None:
        super().__init__(why)
        self.answered = answered
        self.unprocessed = unprocessed


class Reset(Exception):
    """The server reset the call's stream (RST_STREAM) with this HTTP/2 error code."""

    def __init__(self, code: int) -> None:
        super().__init__(error_name(code))
        self.code = code


class Stream(Protocol):
    """The receiving end of the stream in flight; its methods may raise to refuse what
    arrived, and the call then ends with that exception (through ``failed``)."""

    def on_headers(self, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_data(self, data: bytes) -> None: ...
    def on_trailers(self, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_end(self) -> None: ...
    def failed(self, error: BaseException) -> None: ...


def error_name(code: int) -> str:
    """An HTTP/2 error code as RFC 9113 names it."""
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return f"error {code}"


class _H2Connection(h2.connection.H2Connection):
    """h2's connection, except that a GOAWAY leaves the connection open (see above)."""

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[Any]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class _FrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, except that a frame over the frame size is refused at its 9-byte
    header, as soon as it arrives: h2 would first read its whole payload (up to 16 MiB)."""

    def __next__(self) -> Any:
        if len(self._data) >= 9:
            self._validate_frame_length(int.from_bytes(self._data[:3], "big"))
        return super().__next__()


def client(window: int, max_header_list: int) -> h2.connection.H2Connection:
    """h2's client side as this module uses it, its preface queued: no server push, the
    flow-control window ``window`` for the connection and each stream, header lists of
    at most ``max_header_list`` bytes."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        # the request's headers are this client's own constants; the server's are checked
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = _H2Connection(config)
    codes = h2.settings.SettingCodes
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            codes.ENABLE_PUSH: 0,
            codes.INITIAL_WINDOW_SIZE: window,
            codes.MAX_HEADER_LIST_SIZE: max_header_list,
        },
    )
    conn.decoder.max_header_list_size = max_header_list
    conn.incoming_buffer = _FrameBuffer()
    conn.initiate_connection()
    if window > 65_535:  # the connection's window starts at 65,535 whatever SETTINGS say
        conn.increment_flow_control_window(window - 65_535)
    return conn


class Connection:
    """One client connection; ``window``: the flow-control window offered for the
    connection and each stream (bytes); ``max_header_list``: the largest header list
    taken in (bytes, as HPACK counts them)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        window: int,
        max_header_list: int,
    ) -> None:
        self._reader, self._writer = reader, writer
        self._h2, self._window = client(window, max_header_list), window
        self._stream: tuple[int, Stream] | None = None
        self._answered = False  # the stream in flight got its headers
        self._settled = False  # the server's first frame, SETTINGS, arrived
        self._budget = IDLE_BYTES  # bytes the server may still send
        self._limit = IDLE_BYTES
        self._events = IDLE_EVENTS  # h2 events the server may still cause
        self.draining = False  # a GOAWAY arrived: no new stream
        self.closed = False
        self._flush()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @property
    def usable(self) -> bool:
        """True while a new stream may be started here."""
        return not (self.closed or self.draining or self._stream is not None)

    def start(
        self, headers: list[tuple[bytes, bytes]], body: bytes, stream: Stream, budget: int
    ) -> None:
        """Send a request of ``headers`` and ``body``; what comes back goes to ``stream``,
        and the server may send at most ``budget`` bytes until :meth:`finish`."""
        try:
            if (gap := self._window - self._h2.inbound_flow_control_window) > 0:
                self._h2.increment_flow_control_window(gap)  # a whole answer fits, unstalled
            sid = self._h2.get_next_available_stream_id()
            self._h2.send_headers(sid, headers)
            self._h2.send_data(sid, body, end_stream=True)
        except h2.exceptions.H2Error as e:  # no stream ID left, or the server allows none
            self.close()
            raise Broken(f"the connection takes no new call ({e})", False) from None
        self._stream, self._answered = (sid, stream), False
        self._budget = self._limit = budget
        self._events = CALL_EVENTS
        self._flush()

    def finish(self) -> None:
        """The call is over: bytes between calls are bounded again, and a connection the
        server is closing (GOAWAY) is closed now."""
        self._stream = None
        self._budget = self._limit = IDLE_BYTES
        self._events = IDLE_EVENTS
        if self.draining:
            self.close()

    def close(self) -> None:
        """Close the socket and stop reading (idempotent)."""
        self.closed = True
        self._writer.close()
        if self._task is not asyncio.current_task():
            self._task.cancel()

    async def wait_closed(self, timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) for the socket to be closed."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), timeout_s)

    def _flush(self) -> None:
        if (out := self._h2.data_to_send()) and not self.closed:
            self._writer.write(out)

    async def _read(self) -> None:
        try:
            while not self.closed:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    return self._broken("the server closed the connection")
                self._budget -= len(data)
                if self._budget < 0:
                    when = "for one call" if self._stream else "between calls"
                    return self._broken(f"the server sent more than {self._limit} bytes {when}")
                try:
                    events = self._h2.receive_data(data)
                    for event in events:
                        self._event(event)
                except h2.exceptions.ProtocolError as e:
                    return self._broken(f"the server's answer is not valid HTTP/2 ({_why(e)})")
                self._events -= len(events)
                if self._events < 0:
                    when = "for one call" if self._stream else "between calls"
                    return self._broken(f"the server sent more frames than allowed {when}")
                self._flush()  # the acks h2 owes (SETTINGS, PING), and WINDOW_UPDATEs
                if self.draining and self._stream is None:
                    return self.close()  # a GOAWAY while idle: let the server go now
                if len(data) == READ_CHUNK:  # more may be buffered, and reading it
                    await asyncio.sleep(0)  # would not let other tasks run
        except ConnectionError:
            self._broken("the server closed the connection")
        except OSError as e:
            self._broken(f"connection error: {e.strerror or e}")
        except Exception as e:  # h2 met bytes it did not expect: refuse them, do not die
            self._broken(f"the server's answer is not valid HTTP/2 ({type(e).__name__})")

    def _broken(self, why: str) -> None:
        stream = self._stream
        self.close()
        if stream is not None:
            stream[1].failed(Broken(why, self._answered))

    def _event(self, event: Any) -> None:
        if not self._settled:
            if not isinstance(event, h2.events.RemoteSettingsChanged):
                raise h2.exceptions.ProtocolError("the server did not begin with SETTINGS")
            self._settled = True
        if isinstance(event, h2.events.ConnectionTerminated):
            return self._goaway(event)
        sid = getattr(event, "stream_id", 0)
        if isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
        if self._stream is None or sid != self._stream[0]:
            return None  # the connection's own (acks are h2's), or late frames of a past call
        stream = self._stream[1]
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return None
        if isinstance(event, h2.events.ResponseReceived):
            self._answered = True
        try:
            handler(stream, event)
        except Exception as e:  # the call refuses what arrived
            stream.failed(e)
        return None

    def _goaway(self, event: Any) -> None:
        self.draining = True
        if self._stream is None:
            return  # idle: closed once this read's acks are out
        sid, stream = self._stream
        code = error_name(int(event.error_code))
        if event.last_stream_id < sid:
            why = f"the server closed the connection (GOAWAY {code}) before the call"
            stream.failed(Broken(why, self._answered, unprocessed=True))
        # else: the call was taken in; it finishes, then finish() closes the connection


def _why(e: h2.exceptions.ProtocolError) -> str:
    """h2's reason, in words where it gives only a number."""
    if isinstance(e, h2.exceptions.NoSuchStreamError):
        return f"a frame on stream {e.stream_id}, which this client did not open"
    return str(e)


def _reset(stream: Stream, event: Any) -> None:
    stream.failed(Reset(int(event.error_code)))


_HANDLERS: dict[type, Callable[[Stream, Any], None]] = {
    h2.events.ResponseReceived: lambda s, e: s.on_headers(e.headers),
    h2.events.DataReceived: lambda s, e: s.on_data(e.data),
    h2.events.TrailersReceived: lambda s, e: s.on_trailers(e.headers),
    h2.events.StreamEnded: lambda s, e: s.on_end(),
    h2.events.StreamReset: _reset,
}
