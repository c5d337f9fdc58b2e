"""The kubelet client when the kubelet shuts down gracefully, as gRPC servers do.

grpc-go's GracefulStop (the kubelet's server) sends GOAWAY with last-stream-id 2^31-1
and NO_ERROR, then a PING; on the PING's ack a final GOAWAY naming the last stream it
took; it closes the connection once no stream is left (RFC 9113 section 6.8). The call
in flight must finish, and a client idle between two calls must let the server go at
once, not at its next call (30 s later at the default interval). grpcio's server does
the same on ``stop(grace)``; the scripted kubelet sends grpc-go's frames exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import PodResourcesClient
from tests.procs import Exporter, wait_until
from tests.support.fakekubelet import FakeKubelet
from tests.workloads.kubelet import h2kubelet as http2
from tests.workloads.kubelet.h2kubelet import H2Kubelet, Peer, message

ANSWER = pb.ListPodResourcesResponse(
    pod_resources=[pb.PodResources(name="train-0", namespace="ml")]
).SerializeToString()
LAST = 2**31 - 1
NO_ERROR = (0).to_bytes(4, "big")


def goaway(last: int) -> bytes:
    return http2.frame(http2.GOAWAY, 0, 0, last.to_bytes(4, "big") + NO_ERROR)


async def graceful_stop(peer: Peer, last: int) -> None:
    """grpc-go's drain: GOAWAY(2^31-1), PING, and on its ack GOAWAY(``last``)."""
    await peer.raw(goaway(LAST) + http2.frame(http2.PING, 0, 0, b"drain-01"))
    while not peer.ping_acks:
        assert await peer.read(), "the client closed the connection before acking the PING"
    with contextlib.suppress(ConnectionError):  # an idle client may be gone already
        await peer.raw(goaway(last))


async def first_request(peer: Peer, kubelet: H2Kubelet) -> int | None:
    """The first request's stream on the kubelet's first connection; on a later one (the
    client dialled again) every request gets ANSWER, and None comes back."""
    if len(kubelet.peers) > 1:
        while (sid := await peer.request()) is not None:
            await peer.answer(sid, message(ANSWER))
        return None
    return await peer.request()


async def test_a_call_in_flight_finishes_across_a_graceful_goaway(tmp_path):
    closed_after: list[float] = []

    async def script(peer: Peer) -> None:
        if (sid := await first_request(peer, kubelet)) is None:
            return
        body = message(ANSWER)
        peer.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        peer.conn.send_data(sid, body[:7])
        await peer.flush()
        await graceful_stop(peer, last=sid)  # in the middle of the answer
        peer.conn.send_data(sid, body[7:])
        peer.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        await peer.flush()
        ended = time.monotonic()
        await peer.until_eof()  # the client closes the connection once its call is done
        closed_after.append(time.monotonic() - ended)

    async with H2Kubelet(tmp_path / "k.sock", script) as kubelet:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
        assert await client.list_bytes() == ANSWER
        await asyncio.sleep(0.2)
        assert kubelet.peers[0].ping_acks == [b"drain-01"]
        assert closed_after and closed_after[0] < 1.0
        assert await client.list_bytes() == ANSWER  # the next call dials again
        await client.close()
    assert kubelet.connections == 2


async def test_a_goaway_and_ping_between_calls_are_answered_at_once(tmp_path):
    """The client idles after a call; the server drains: the PING is acked and the
    connection closed within a second, without another call."""
    times: dict[str, float] = {}

    async def script(peer: Peer) -> None:
        if (sid := await first_request(peer, kubelet)) is None:
            return
        await peer.answer(sid, message(ANSWER))
        await asyncio.sleep(0.3)  # the client is idle now
        times["drain"] = time.monotonic()
        await graceful_stop(peer, last=sid)
        times["acked"] = time.monotonic()
        await peer.until_eof()
        times["closed"] = time.monotonic()

    async with H2Kubelet(tmp_path / "k.sock", script) as kubelet:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
        assert await client.list_bytes() == ANSWER
        for _ in range(40):  # idle, as between two collection cycles
            await asyncio.sleep(0.05)
            if "closed" in times:
                break
        assert times["closed"] - times["drain"] < 1.0
        assert await client.list_bytes() == ANSWER
        await client.close()
    assert kubelet.connections == 2


async def test_a_server_that_floods_an_idle_connection_is_cut_off(tmp_path):
    sent: list[int] = []

    async def script(peer: Peer) -> None:
        if (sid := await first_request(peer, kubelet)) is None:
            return
        await peer.answer(sid, message(ANSWER))
        try:
            for i in range(100_000):  # PINGs nobody asked for, between calls
                await peer.raw(http2.frame(http2.PING, 0, 0, i.to_bytes(8, "big")))
                sent.append(i)
        except ConnectionError:
            pass

    async with H2Kubelet(tmp_path / "k.sock", script) as kubelet:
        client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
        assert await client.list_bytes() == ANSWER
        await asyncio.sleep(1.0)
        assert await client.list_bytes() == ANSWER  # on a new connection
        await client.close()
    assert kubelet.connections == 2
    assert len(sent) < 100_000  # the client stopped reading them: the connection is gone


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", pb.ListPodResourcesResponse.FromString(ANSWER))
    yield k.start()
    k.close()


async def test_grpcio_graceful_stop_lets_the_call_in_flight_finish(kubelet):
    client = PodResourcesClient(str(kubelet.socket_path), timeout_s=5)
    assert await client.list_bytes() == ANSWER
    kubelet.mode, kubelet.delay = "slow", 1.0
    call = asyncio.create_task(client.list_bytes())
    await asyncio.sleep(0.3)  # the call is in flight
    took = await kubelet.stop_gracefully(10.0)
    assert await call == ANSWER
    assert took < 2.0  # the call's second, not the 10 s of grace
    await client.close()


async def test_grpcio_graceful_stop_is_not_held_by_an_idle_client(kubelet):
    client = PodResourcesClient(str(kubelet.socket_path), timeout_s=5)
    assert await client.list_bytes() == ANSWER  # then idle, its connection open
    took = await kubelet.stop_gracefully(30.0)
    assert took < 1.0
    await client.close()


@pytest.mark.slow
def test_the_kubelet_stops_at_once_while_the_exporter_idles_at_30s(kubelet, tmp_path):
    """The exporter at its default interval asks the kubelet once, then idles for 30 s:
    the kubelet's graceful stop takes well under a second, not the rest of the interval."""
    node = Exporter(
        "-c", "30000", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path),
        log=tmp_path / "log",
    )  # fmt: skip
    try:
        node.wait_ready()
        wait_until(lambda: kubelet.calls >= 1, 15, "the exporter's first List")
        time.sleep(1.0)  # idle between two cycles
        took = asyncio.run(kubelet.stop_gracefully(30.0))
    finally:
        node.stop()
    assert took < 1.0, took
