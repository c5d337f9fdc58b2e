"""workloads/advertised.py: the replicas the device plugins advertise, from a real gRPC
kubelet on a unix socket (the fake kubelet), and what happens when it cannot tell."""

from __future__ import annotations

import pytest

from exporter.workloads import ids
from exporter.workloads.advertised import AdvertisedReplicas
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import KubeletUnavailable, PodResourcesClient
from exporter.workloads.mapper import Mapper


@pytest.fixture
async def asked(kubelet):
    client = PodResourcesClient(str(kubelet.socket_path), timeout_s=2)
    yield AdvertisedReplicas(client, Mapper(client).wanted)
    await client.close()


def plugin(gpu_uuid: str, replicas: int, *whole: str) -> pb.AllocatableResourcesResponse:
    ids_ = [f"{gpu_uuid}::{r}" for r in range(replicas)]
    return pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[*ids_, *whole]),
            pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga0::1"]),
        ]
    )


async def test_the_replicas_advertised_per_device(asked, kubelet, inventory):
    gpus, migs = inventory
    kubelet.allocatable = plugin(gpus[1].uuid, 6, gpus[0].uuid)
    await asked.refresh(gpus.values(), migs.values(), 0.0)
    assert asked.status == ""
    # whole GPUs are not listed: only devices advertised in replicas
    assert dict(asked.replicas) == {gpus[1].key: frozenset(str(r) for r in range(6))}


async def test_a_kubelet_without_the_call_leaves_them_unknown(asked, kubelet, inventory):
    gpus, migs = inventory
    kubelet.allocatable = plugin(gpus[1].uuid, 6)
    await asked.refresh(gpus.values(), migs.values(), 0.0)
    kubelet.mode = "unimplemented"
    await asked.refresh(gpus.values(), migs.values(), 100.0)
    assert "UNIMPLEMENTED" in asked.status and dict(asked.replicas) == {}


async def test_when_to_ask(asked, kubelet, inventory):
    gpus, migs = inventory
    held = {gpus[1].key: {"a": ("0",), "b": ("1",)}}
    assert not asked.due({}, 0.0)  # nothing time-sliced: never asked
    assert asked.due(held, 0.0)
    kubelet.allocatable = plugin(gpus[1].uuid, 4)
    await asked.refresh(gpus.values(), migs.values(), 0.0)
    assert not asked.due(held, 30.0) and asked.due(held, 60.0)
    new = {gpus[1].key: {"a": ("0",), "c": ("9",)}}  # a replica not advertised
    assert not asked.due(new, 1.0) and asked.due(new, 6.0)


def test_an_answer_that_does_not_decode_is_one_error(inventory):
    gpus, migs = inventory
    asked = AdvertisedReplicas(PodResourcesClient("/nonexistent"), lambda name: True)
    with pytest.raises(KubeletUnavailable, match="GetAllocatableResources"):
        asked.parse(b"\x0a\x05\x0a", ids.Resolver(list(gpus.values()), list(migs.values())))
