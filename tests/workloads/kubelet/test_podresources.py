"""The kubelet client (gRPC over h2) against a real gRPC server: the fake kubelet, grpcio's
own server on a unix socket, as Kubernetes' Go gRPC server would answer."""

from __future__ import annotations

import socket
import time

import pytest

from exporter.workloads.kubelet import grpcclient, podresources
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import KubeletUnavailable, PodResourcesClient
from tests.support.fakekubelet import FakeKubelet

PODS = pb.ListPodResourcesResponse(
    pod_resources=[
        pb.PodResources(
            name="train-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="main",
                    devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["x"])],
                )
            ],
        )
    ]
)


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", PODS).start()
    yield k
    k.close()


@pytest.fixture
async def client(kubelet):
    c = PodResourcesClient(str(kubelet.socket_path), timeout_s=5)
    yield c
    await c.close()


async def test_the_answer_comes_back_as_the_server_encoded_it(client, kubelet):
    for _ in range(3):
        assert await client.list_bytes() == PODS.SerializeToString()
    resp = await client.list()
    assert [(p.name, p.namespace) for p in resp.pod_resources] == [("train-0", "ml")]
    assert kubelet.calls == 4


async def test_rate_limited(client, kubelet):
    kubelet.mode = "exhausted"
    with pytest.raises(KubeletUnavailable) as e:
        await client.list_bytes()
    assert str(e.value) == "kubelet rate-limited List (RESOURCE_EXHAUSTED)"
    assert e.value.throttled
    kubelet.mode = "ok"
    assert await client.list_bytes() == PODS.SerializeToString()  # same connection, next call


async def test_a_slow_kubelet_meets_the_deadline(kubelet):
    kubelet.mode, kubelet.delay = "slow", 6.0
    client = PodResourcesClient(str(kubelet.socket_path), timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(KubeletUnavailable) as e:
        await client.list_bytes()
    # the server may end the call itself (it reads grpc-timeout) just before the client does
    assert str(e.value).startswith("kubelet List failed: DEADLINE_EXCEEDED: ")
    assert time.monotonic() - started < 4  # not the kubelet's 6 s
    kubelet.mode = "ok"
    assert await client.list_bytes() == PODS.SerializeToString()  # dialled again
    await client.close()


async def test_an_unknown_method_is_unimplemented(kubelet):
    channel = grpcclient.Channel(str(kubelet.socket_path), max_message=podresources.MAX_MESSAGE)
    with pytest.raises(grpcclient.CallError) as e:
        await channel.call("/v1.PodResourcesLister/NoSuchMethod", b"", 5)
    assert e.value.code == "UNIMPLEMENTED"
    await channel.close()


async def test_a_kubelet_restart_is_followed(client, kubelet):
    assert await client.list_bytes() == PODS.SerializeToString()
    kubelet.stop()
    stale = socket.socket(socket.AF_UNIX)  # a socket file left behind, nobody listening
    stale.bind(str(kubelet.socket_path))
    stale.close()
    with pytest.raises(KubeletUnavailable) as e:
        await client.list_bytes()
    assert str(e.value) == (
        f"kubelet List failed: UNAVAILABLE: cannot connect to {kubelet.socket_path}: "
        "Connection refused"
    )
    kubelet.stop()
    kubelet.start()
    assert await client.list_bytes() == PODS.SerializeToString()


async def test_a_missing_socket(client, kubelet):
    kubelet.stop()
    with pytest.raises(KubeletUnavailable) as e:
        await client.list_bytes()
    assert e.value.missing and "does not exist" in str(e.value)


def test_grpc_timeout_spelling():
    assert grpcclient.grpc_timeout(5) == "5000m"
    assert grpcclient.grpc_timeout(0.0001) == "1m"
    assert grpcclient.grpc_timeout(10**6) == "1000000S"
