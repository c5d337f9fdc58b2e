"""workloads/attribution.py with thousands of holders in one kubelet answer (real gRPC on
a unix socket): what the first answer that lists them costs the event loop."""

from __future__ import annotations

from types import MappingProxyType

from exporter.config.model import KubeConfig
from exporter.snapshot import Snapshot
from exporter.workloads import attribution, usage
from exporter.workloads.attribution import Attribution
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from tests.support.fakekubelet import FakeKubelet

T0 = 1.8e9


def time_sliced(uuids: list[str], holders: int) -> pb.ListPodResourcesResponse:
    """``holders`` containers, 100 to a pod, container k on replica k // len(uuids) of
    GPU k % len(uuids): every GPU shared by holders / len(uuids) containers."""
    resp = pb.ListPodResourcesResponse()
    for p in range(holders // 100):
        pod = resp.pod_resources.add(name=f"p{p}", namespace="ns")
        for k in range(p * 100, (p + 1) * 100):
            c = pod.containers.add(name=f"c{k}")
            c.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{uuids[k % 6]}::{k}"])
    return resp


async def test_holders_first_seen_cost_no_walk_over_their_devices_other_holders(
    tmp_path, inventory, monkeypatch
) -> None:
    """Every holder is new in the first answer: its share of its GPU is worked out once a
    GPU, not once a holder over all the GPU's holders (that took 8,000 holders on 6 GPUs
    11 times the CPU 2,000 took, and stopped the event loop, scrapes included, for 24 s
    with 20,000 on a loaded 2-core host); each share is right. The work is counted in
    calls of ``shares`` (one walk over a GPU's holders each), not timed."""
    gpus = [g for g in inventory[0].values() if not g.is_mig][:6]
    snap = Snapshot(T0, 0.0, gpus=tuple(gpus), entities=tuple(gpus), values=MappingProxyType({}))
    walks = []
    monkeypatch.setattr(
        attribution, "shares", lambda *a: walks.append(len(a[0])) or usage.shares(*a)
    )

    async def first_refresh_walks(holders: int) -> list[int]:
        answer = time_sliced([g.uuid for g in gpus], holders)
        kubelet = FakeKubelet(tmp_path / f"k{holders}.sock", answer).start()
        attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=10))
        walks.clear()
        try:
            await attr.refresh(snap)
            assert not attr.mapper.status, attr.mapper.status
            owners = attr.mapper.map.owners
            assert sum(len(v) for v in owners.values()) == holders
            # each holder's share: its one replica of the replicas its GPU's holders hold
            windows = attr.windows()
            assert len(windows) == holders
            assert all(w.share == 1 / len(owners[hk[0]]) for hk, w in windows.items())
            return list(walks)
        finally:
            await attr.close()
            kubelet.close()

    small, big = await first_refresh_walks(2000), await first_refresh_walks(8000)
    assert len(small) == len(big) <= len(gpus), (len(small), len(big))
    assert sum(big) == 8000 and sum(small) == 2000  # each GPU's holders walked once
