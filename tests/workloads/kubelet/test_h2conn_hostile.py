"""The kubelet client against answers at the HTTP/2 level that a broken or hostile
kubelet could send: each one ends in one clear KubeletUnavailable reason within the
deadline, within the bounds on bytes, headers and frames, and the next call dials again."""

from __future__ import annotations

import asyncio
import logging
import time

import h2.settings
import pytest

from exporter.workloads.kubelet import grpcclient, h2conn, podresources
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import KubeletUnavailable, PodResourcesClient
from exporter.workloads.mapper import Mapper
from tests.workloads.kubelet import h2kubelet as http2
from tests.workloads.kubelet.h2kubelet import H2Kubelet, Peer, message

ANSWER = pb.ListPodResourcesResponse(
    pod_resources=[pb.PodResources(name="train-0", namespace="ml")]
).SerializeToString()


async def ok(peer: Peer) -> None:
    """A well-behaved kubelet: every request on the connection gets ANSWER."""
    while (sid := await peer.request()) is not None:
        await peer.answer(sid, message(ANSWER))


async def reason(tmp_path, script, timeout_s: float = 5.0) -> str:
    """The reason of the KubeletUnavailable one List against ``script`` raises."""
    async with H2Kubelet(tmp_path / "k.sock", script):
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=timeout_s)
        try:
            with pytest.raises(KubeletUnavailable) as e:
                await client.list_bytes()
        finally:
            await client.close()
    return str(e.value)


async def answered(
    tmp_path, script, calls: int = 2, expect: bytes = ANSWER, timeout_s: float = 5.0
) -> H2Kubelet:
    """``calls`` Lists in a row against ``script``, each answered ``expect``; the kubelet,
    for what it saw (connections, requests, PING acks)."""
    async with H2Kubelet(tmp_path / "k.sock", script) as k:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=timeout_s)
        for _ in range(calls):
            assert await client.list_bytes() == expect
        await client.close()
    return k


async def test_request_headers_are_those_of_a_grpc_client(tmp_path):
    k = await answered(tmp_path, ok, calls=3)
    assert k.connections == 1  # one connection, reused
    h = k.peers[0].requests[0]
    assert h[b":method"] == b"POST" and h[b":scheme"] == b"http"
    assert h[b":path"] == b"/v1.PodResourcesLister/List"
    assert h[b":authority"] == b"localhost"
    assert h[b"content-type"] == b"application/grpc" and h[b"te"] == b"trailers"
    assert h[b"grpc-timeout"] == b"5000m"
    assert h[b"user-agent"].startswith(b"gpu-exporter/")


async def test_an_answer_of_the_largest_size_arrives_without_stalls(tmp_path, monkeypatch):
    big = b"\x0a" + b"x" * (podresources.MAX_MESSAGE - 1)  # not a valid message; bytes only
    monkeypatch.setattr(grpcclient, "FRAME_ALLOWANCE_BYTES", 64 * 1024)

    async def script(peer: Peer) -> None:
        while (sid := await peer.request()) is not None:
            await peer.answer(sid, message(big))  # asserts the windows never close

    # the connection window is handed back between calls
    k = await answered(tmp_path, script, calls=3, expect=big, timeout_s=20)
    assert k.connections == 1


@pytest.mark.parametrize(
    ("status", "message_", "expected"),
    [
        (b"14", b"kubelet%20is%20restarting", "kubelet List failed: UNAVAILABLE: kubelet is "),
        (b"12", b"unknown method", "kubelet List failed: UNIMPLEMENTED: unknown method"),
        (b"8", b"slow down", "kubelet rate-limited List (RESOURCE_EXHAUSTED)"),
        (b"99", b"", "kubelet List failed: UNKNOWN: "),
    ],
)
async def test_a_trailers_only_error_names_the_grpc_code(tmp_path, status, message_, expected):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        headers += [(b"grpc-status", status), (b"grpc-message", message_)]
        peer.conn.send_headers(sid, headers, end_stream=True)
        await peer.flush()
        await peer.request()

    assert (await reason(tmp_path, script)).startswith(expected)


async def test_a_long_error_message_is_cut(tmp_path):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        trailers = [(b"grpc-status", b"13"), (b"grpc-message", b"%0A" + b"e" * 5000)]
        await peer.answer(sid, b"", trailers)
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.startswith("kubelet List failed: INTERNAL:  eee")  # the newline is a space
    assert len(why) == len("kubelet List failed: INTERNAL: ") + podresources.MAX_DETAILS_CHARS


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (message(ANSWER, compressed=1), "compressed"),
        (message(ANSWER) + message(ANSWER), "more than one message"),
        (message(ANSWER)[:-1], "no complete message"),
        (b"", "no complete message"),
    ],
)
async def test_an_answer_that_is_not_one_plain_message_is_invalid(tmp_path, body, expected):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        await peer.answer(sid, body)
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.startswith(podresources.INVALID) and expected in why


async def test_an_announced_length_over_the_bound_is_refused_before_the_body(tmp_path):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        peer.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        peer.conn.send_data(sid, b"\0" + (2**32 - 1).to_bytes(4, "big") + b"x" * 100)
        await peer.flush()
        await asyncio.sleep(30)  # the 4 GiB never follow: the client must not wait for them

    started = time.monotonic()
    why = await reason(tmp_path, script, timeout_s=20)
    assert (
        why == f"kubelet List answer is larger than {podresources.MAX_MESSAGE} bytes; ignoring it"
    )
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("status", "ctype", "expected"),
    [
        (b"503", b"text/plain", "UNAVAILABLE: HTTP status 503"),
        (b"404", b"text/plain", "UNIMPLEMENTED: HTTP status 404"),
        (b"200", b"text/html", "UNKNOWN: content-type b'text/html' is not application/grpc"),
    ],
)
async def test_an_answer_that_is_not_grpc(tmp_path, status, ctype, expected):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        peer.conn.send_headers(sid, [(b":status", status), (b"content-type", ctype)])
        peer.conn.send_data(sid, b"<html>no</html>", end_stream=True)
        await peer.flush()
        await peer.request()

    assert await reason(tmp_path, script) == f"kubelet List failed: {expected}"


async def test_oversized_headers_are_refused(tmp_path):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        big = [(b"x-padding-%d" % i, b"v" * 1000) for i in range(40)]  # 40 KiB of headers
        headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), *big]
        peer.conn.send_headers(sid, headers)
        await peer.flush()
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.startswith(
        "kubelet List failed: UNAVAILABLE: the server's answer is not valid HTTP/2"
    )


async def test_a_frame_over_the_frame_size_is_refused(tmp_path):
    async def script(peer: Peer) -> None:
        await peer.request()
        # a DATA frame header announcing 1 MiB on stream 1 (frames are at most 16 KiB here)
        await peer.raw((1 << 20).to_bytes(3, "big") + b"\0\0" + (1).to_bytes(4, "big"))
        await peer.raw(b"x" * 4096)
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.startswith(
        "kubelet List failed: UNAVAILABLE: the server's answer is not valid HTTP/2"
    )
    assert "Received overlong frame: length 1048576, max 16384" in why


@pytest.mark.parametrize("kind", ["ping", "settings"])
async def test_a_control_frame_flood_ends_at_the_byte_bound(tmp_path, monkeypatch, kind):
    async def script(peer: Peer) -> None:
        await peer.request()
        for i in range(100_000):  # 1.7 MB of PINGs or 0.9 MB of SETTINGS, never an answer
            if kind == "ping":
                peer.conn.ping(i.to_bytes(8, "big"))
            else:
                peer.conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: i})
            if i % 1000 == 999:
                await peer.flush()
        await peer.request()

    # a small message bound keeps the test short: the byte bound follows from it
    monkeypatch.setattr(podresources, "MAX_MESSAGE", 16 * 1024)
    monkeypatch.setattr(grpcclient, "FRAME_ALLOWANCE_BYTES", 64 * 1024)
    why = await reason(tmp_path, script, timeout_s=20)
    assert why == (
        "kubelet List failed: UNAVAILABLE: the server sent more than 81920 bytes for one call"
    )


@pytest.mark.parametrize("kind", [http2.PING, http2.SETTINGS])
async def test_a_control_frame_flood_ends_at_the_frame_bound_in_short_steps(tmp_path, kind):
    """60,000 PINGs (1 MB) or empty SETTINGS, within the byte bound: h2 takes them in a
    read at a time (16 KiB, about 20 ms of CPU at most), other tasks running in between,
    and the call ends once they pass h2conn.CALL_EVENTS."""
    payload = b"8 bytes!" if kind == http2.PING else b""

    async def script(peer: Peer) -> None:
        await peer.request()
        for _ in range(60):
            await peer.raw(F(kind, 0, 0, payload) * 1000)
        await peer.request()

    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.002)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    try:
        why = await reason(tmp_path, script, timeout_s=20)
    finally:
        tick.cancel()
    assert why == (
        "kubelet List failed: UNAVAILABLE: the server sent more frames than allowed for one call"
    )
    # other tasks ran between reads (11 to 21 of them here, a few ms each), not once the
    # whole flood was read: a scrape waits for a read or two, not for the flood
    assert len(gaps) >= 3, gaps


async def test_a_server_that_never_answers_meets_the_deadline(tmp_path):
    async def script(peer: Peer) -> None:
        await asyncio.sleep(30)  # accepts and stays silent, not even SETTINGS

    started = time.monotonic()
    why = await reason(tmp_path, script, timeout_s=0.5)
    assert why == "kubelet List failed: DEADLINE_EXCEEDED: no answer within 0.5 s"
    assert time.monotonic() - started < 5


async def test_a_server_that_closes_mid_message(tmp_path):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        peer.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        peer.conn.send_data(sid, message(ANSWER)[:8])
        await peer.flush()
        peer.writer.close()

    why = await reason(tmp_path, script)
    assert why == "kubelet List failed: UNAVAILABLE: the server closed the connection"


@pytest.mark.parametrize("how", ["close", "goaway"])
async def test_a_connection_the_kubelet_ends_after_an_answer_is_dialled_again(tmp_path, how):
    """Closed while idle (e.g. a kubelet restart between two cycles), or a GOAWAY right
    after a whole answer (a kubelet shutting down): the answer counts, the next call dials."""

    async def one_answer(peer: Peer) -> None:
        sid = await peer.request()
        await peer.answer(sid, message(ANSWER))
        if how == "close":
            peer.writer.close()
            return
        peer.conn.close_connection(last_stream_id=sid)
        await peer.flush()
        await peer.request()

    async with H2Kubelet(tmp_path / "k.sock", one_answer) as k:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
        for _ in range(3):
            assert await client.list_bytes() == ANSWER
            await asyncio.sleep(0.05)
        await client.close()
    assert k.connections == 3


async def test_goaway_before_the_call_is_served_dials_again(tmp_path):
    async def script(peer: Peer) -> None:
        if len(peer_log) == 0:
            peer_log.append(peer)
            await peer.request()
            peer.conn.close_connection(last_stream_id=0)  # refuses the call: ask elsewhere
            await peer.flush()
            return
        await ok(peer)

    peer_log: list[Peer] = []
    async with H2Kubelet(tmp_path / "k.sock", script) as k:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
        assert await client.list_bytes() == ANSWER
        await client.close()
    assert k.connections == 2


async def test_garbage_is_one_clear_reason_without_a_traceback(tmp_path, inventory, caplog):
    async def script(peer: Peer) -> None:
        await peer.reader.read(1024)
        await peer.raw(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await peer.request()

    gpus, migs = inventory
    async with H2Kubelet(tmp_path / "k.sock", script):
        m = Mapper(PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5))
        with caplog.at_level(logging.DEBUG, logger="exporter"):
            await m.refresh(gpus.values(), migs.values())
        await m.client.close()
    assert m.status.startswith(
        "kubelet List failed: UNAVAILABLE: the server's answer is not valid HTTP/2"
    )
    assert "\n" not in m.status
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def _fields(*pairs: tuple[bytes, bytes]) -> bytes:
    """A header block any HPACK decoder takes as it is (literals, nothing indexed)."""
    return http2.literal_block(list(pairs))


OK_HEADERS = _fields((b":status", b"200"), (b"content-type", b"application/grpc"))
OK_TRAILERS = _fields((b"grpc-status", b"0"))
F = http2.frame


async def test_frames_a_server_may_send_are_taken_in(tmp_path):
    """A header block split over CONTINUATION frames, padding, a priority in HEADERS, a
    frame type this client does not know, a PING (acknowledged with its payload)."""
    body = message(ANSWER)

    async def script(peer: Peer) -> None:
        sid = await peer.request()
        await peer.raw(
            F(http2.PING, 0, 0, b"12345678")
            + F(0xFA, 0, 0, b"an extension frame")
            + F(http2.HEADERS, http2.PRIORITY_FLAG, sid, b"\0\0\0\0\x10" + OK_HEADERS[:9])
            + F(http2.CONTINUATION, 0, sid, OK_HEADERS[9:20])
            + F(http2.CONTINUATION, http2.END_HEADERS, sid, OK_HEADERS[20:])
            + F(http2.DATA, http2.PADDED, sid, b"\x03" + body[:7] + b"\0\0\0")
            + F(http2.DATA, 0, sid, body[7:])
            + F(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, sid, OK_TRAILERS)
        )
        await ok(peer)  # h2 keeps no state of the stream written raw: the next ones are its own

    k = await answered(tmp_path, script)
    assert k.connections == 1
    assert k.peers[0].ping_acks == [b"12345678"]


async def test_late_frames_of_an_ended_answer_leave_it_whole(tmp_path):
    """A RST_STREAM (NO_ERROR) and a DATA frame after the trailers, in the same write: the
    stream has ended, so they are ignored; the answer stands and the connection is kept."""

    async def script(peer: Peer) -> None:
        sid = await peer.request()
        await peer.raw(
            F(http2.HEADERS, http2.END_HEADERS, sid, OK_HEADERS)
            + F(http2.DATA, 0, sid, message(ANSWER))
            + F(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, sid, OK_TRAILERS)
            + F(http2.RST_STREAM, 0, sid, b"\0\0\0\0")
            + F(http2.DATA, 0, sid, b"late")
        )
        await ok(peer)

    k = await answered(tmp_path, script)
    assert k.connections == 1


def _stream_1(kind: int, flags: int, payload: bytes) -> bytes:
    return F(kind, flags, 1, payload)


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (_stream_1(http2.PUSH_PROMISE, 4, b"\0\0\0\2" + OK_HEADERS), "Received pushed stream"),
        (F(http2.DATA, 0, 3, b"x"), "a frame on stream 3, which this client did not open"),
        (F(http2.DATA, 0, 2, b"x"), "a frame on stream 2, which this client did not open"),
        (_stream_1(http2.CONTINUATION, 4, OK_HEADERS), "RECV_CONTINUATION"),
        (_stream_1(http2.HEADERS, 0, OK_HEADERS) + F(6, 0, 0, b"8 bytes!"), "during header block"),
        (_stream_1(http2.DATA, http2.PADDED, b"\x05abcd"), "padding"),
        (_stream_1(http2.HEADERS, 4, b"\xff\xff\xff\xff"), "Error decoding header block"),
        (_stream_1(http2.HEADERS, 4, _fields((b"Grpc-Status", b"0"))), "uppercase header name"),
        (
            _stream_1(http2.HEADERS, 4, _fields((b":path", b"/"))),
            "missing mandatory b':status' header",
        ),
        (_stream_1(http2.DATA, 0, b"\0\0\0\0\0"), "cannot receive data before headers"),
        (F(http2.SETTINGS, 0, 0, b"\0\2\0\0\0\7"), "Setting 2 has invalid value 7"),
        (F(http2.PING, 0, 1, b"8 bytes!"), "Stream ID must be zero for PingFrame"),
        (F(http2.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), "non-compliant data"),
    ],
)
async def test_frames_against_the_protocol_end_the_call_with_one_reason(tmp_path, frames, expected):
    async def script(peer: Peer) -> None:
        sid = await peer.request()
        assert sid == 1
        await peer.raw(frames)
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.startswith(
        "kubelet List failed: UNAVAILABLE: the server's answer is not valid HTTP/2 ("
    )
    assert expected in why


async def test_a_server_that_does_not_begin_with_settings_is_refused(tmp_path):
    async def script(peer: Peer) -> None:
        await peer.raw(F(http2.PING, 0, 0, b"8 bytes!"))  # before h2's own SETTINGS
        await peer.request()
        await peer.request()

    why = await reason(tmp_path, script)
    assert why.endswith("is not valid HTTP/2 (the server did not begin with SETTINGS)")


def _settings_flood_cpu(frames: int) -> float:
    """CPU seconds h2's client side (as exporter/workloads/kubelet/h2conn.py sets it up) takes
    to read ``frames`` empty SETTINGS frames arriving in one read, and queue the acks
    (best of 2)."""
    flood = F(http2.SETTINGS, 0, 0) * frames
    best = float("inf")
    for _ in range(2):
        conn = h2conn.client(grpcclient.FRAME_ALLOWANCE_BYTES, grpcclient.MAX_HEADER_LIST_BYTES)
        conn.data_to_send()
        started = time.process_time()
        conn.receive_data(flood)
        acks = conn.data_to_send()
        best = min(best, time.process_time() - started)
        assert acks == F(http2.SETTINGS, http2.ACK, 0) * frames  # one ack each
    return best


def test_a_settings_flood_costs_linear_time():
    """Ten times the frames in one read cost about ten times the CPU, at sizes where a reply
    buffer grown by copying (the acks of every frame, kept for the next write) would cost
    fifty times or more. The client reads 64 KiB at most (h2conn.READ_CHUNK, 7,281 empty
    SETTINGS frames); these reads are five times that."""
    per_read = 5 * h2conn.READ_CHUNK // 9
    small, large = _settings_flood_cpu(per_read // 10), _settings_flood_cpu(per_read)
    assert large < 25 * small, (small, large)
