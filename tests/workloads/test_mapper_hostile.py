"""A broken or hostile kubelet (a real gRPC server on a unix socket) cannot stop the
mapping, grow memory, create unbounded series or flood the log: every bound of
exporter/workloads/limits.py, tried past its limit."""

from __future__ import annotations

import logging

import pytest

from exporter.workloads import limits
from exporter.workloads.kubelet import podresources
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import PodResourcesClient
from exporter.workloads.mapper import Mapper
from tests.support.fakekubelet import FakeKubelet


def rss_mib() -> float:
    """Resident memory of this process now (MiB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("exporter.workloads") and r.levelno >= logging.WARNING
    ]


def answer(ids_by_resource: dict[str, list[str]], pods: int = 1) -> pb.ListPodResourcesResponse:
    resp = pb.ListPodResourcesResponse()
    for i in range(pods):
        p = resp.pod_resources.add(name=f"p-{i}", namespace="ns")
        c = p.containers.add(name="main")
        for resource, device_ids in ids_by_resource.items():
            c.devices.add(resource_name=resource, device_ids=device_ids)
    return resp


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", pb.ListPodResourcesResponse()).start()
    yield k
    k.close()


@pytest.fixture
async def mapper(kubelet):
    m = Mapper(PodResourcesClient(str(kubelet.socket_path), timeout_s=5))
    yield m
    await m.client.close()


async def refresh(mapper, inventory) -> None:
    gpus, migs = inventory
    mapper._retry_at = 0.0  # ask now, even inside a backoff
    await mapper.refresh(gpus.values(), migs.values())


async def test_malformed_ids_are_skipped_and_the_rest_is_mapped(mapper, kubelet, inventory, caplog):
    gpus, _ = inventory
    bad = ["nvidia" + "9" * 5000, "MIG-GPU-" + "a" * 40 + "/" + "1" * 5000 + "/0", "GPU-zz", ""]
    kubelet.pods = answer({"nvidia.com/gpu": [*bad, gpus[0].key, "nvidia" + "7" * 12]})
    await refresh(mapper, inventory)
    assert mapper.status == "" and mapper.failures == 0
    assert [o.pod for o in mapper.map.owners[gpus[0].key]] == ["p-0"]
    assert mapper.unmatched["nvidia.com/gpu"] == 5
    logged = warnings(caplog)
    assert 0 < len(logged) <= limits.LOG_LINES_PER_MINUTE
    assert all(len(line) < 300 for line in logged)  # a 5,000-digit ID is cut, not echoed


async def test_100000_unknown_ids(mapper, kubelet, inventory, caplog):
    gpus, _ = inventory
    unknown = [f"GPU-{i:08x}" for i in range(100_000)]  # 1.5 MB, under the message bound
    kubelet.pods = answer({"nvidia.com/gpu": [gpus[1].key, *unknown]})
    before = rss_mib()
    for _ in range(3):
        await refresh(mapper, inventory)
    assert mapper.status == ""
    assert set(mapper.map.owners) == {gpus[1].key}  # the real GPU still gets its pod
    per_list = limits.MAX_DEVICE_IDS - 1  # the bound counts the real ID too
    assert mapper.unmatched["nvidia.com/gpu"] == 3 * per_list
    assert mapper.drops["device_ids"] == 3 * (100_001 - limits.MAX_DEVICE_IDS)
    assert len(warnings(caplog)) <= limits.LOG_LINES_PER_MINUTE
    assert rss_mib() - before < 48


async def test_20000_resource_names(mapper, kubelet, inventory, caplog):
    mapper.patterns += ("example.com/*",)
    kubelet.pods = answer({f"example.com/r{i}": ["GPU-nope-0000-0000"] for i in range(20_000)})
    await refresh(mapper, inventory)
    assert mapper.status == ""
    assert mapper.drops["resource_names"] == 20_000 - limits.MAX_RESOURCE_NAMES
    # one series per resource up to the bound, the rest in one "other" series
    assert len(mapper.unmatched) == limits.MAX_UNMATCHED_RESOURCES + 1
    assert mapper.unmatched[limits.OTHER] == limits.MAX_RESOURCE_NAMES - (
        limits.MAX_UNMATCHED_RESOURCES
    )
    assert len(warnings(caplog)) <= limits.LOG_LINES_PER_MINUTE


async def test_too_many_pods_and_containers(mapper, kubelet, inventory):
    gpus, _ = inventory
    resp = answer({"nvidia.com/gpu": [gpus[2].key]}, pods=limits.MAX_KUBELET_PODS + 500)
    resp.pod_resources[0].containers.extend(
        [pb.ContainerResources(name=f"c{i}") for i in range(limits.MAX_CONTAINERS_PER_POD + 10)]
    )
    kubelet.pods = resp
    await refresh(mapper, inventory)
    assert mapper.drops["kubelet_pods"] == 500
    assert mapper.drops["containers"] == 11  # 1 + 138 containers in p-0, 128 looked at
    assert len(mapper.map.owners[gpus[2].key]) == limits.MAX_KUBELET_PODS


async def test_answer_over_the_message_limit_keeps_the_last_map(
    mapper, kubelet, inventory, monkeypatch
):
    gpus, _ = inventory
    kubelet.pods = answer({"nvidia.com/gpu": [gpus[3].key]})
    await refresh(mapper, inventory)
    before = mapper.map
    await mapper.client.close()
    monkeypatch.setattr(podresources, "MAX_MESSAGE", 64 * 1024)  # what the channel is made with
    kubelet.pods = answer({"nvidia.com/gpu": [gpus[3].key] + ["x" * 100] * 1000})
    await refresh(mapper, inventory)
    assert "larger than 65536 bytes" in mapper.status
    assert mapper.map is before


async def test_an_error_while_mapping_keeps_the_last_map(mapper, kubelet, inventory):
    gpus, migs = inventory
    kubelet.pods = answer({"nvidia.com/gpu": [gpus[4].key]})
    await refresh(mapper, inventory)
    before = mapper.map

    def broken_inventory():
        yield gpus[4]
        raise RuntimeError("inventory went away mid-iteration")

    mapper._retry_at = 0.0
    await mapper.refresh(broken_inventory(), migs.values())
    assert mapper.failures == 1 and "could not be mapped" in mapper.status
    assert mapper.map is before
    await refresh(mapper, inventory)  # the next cycle maps again
    assert mapper.status == "" and mapper.map.owners == before.owners


async def test_a_kubelet_flapping_between_errors_logs_a_few_lines(
    mapper, kubelet, inventory, caplog
):
    for i in range(20):
        kubelet.mode = ("exhausted", "malformed")[i % 2]
        await refresh(mapper, inventory)
        assert mapper.status  # each failure is seen
    assert len(warnings(caplog)) <= limits.LOG_LINES_PER_MINUTE
