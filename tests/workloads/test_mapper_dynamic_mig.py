"""Dynamic MIG under DRA: N instances of one profile on one GPU, created and destroyed
under claims in any order, each attributed to its own claim.

The simulated driver creates the GPU instances (real pynvml reads them, placement
included); the claims come from a real gRPC kubelet (the fake kubelet), and their
devices from ResourceSlices as NVIDIA's DRA driver publishes them for dynamic MIG:
named ``gpu-<minor>-mig-<profile>-<profile id>-<placement start>``, ``uuid`` absent.
The truth checked against is the simulator's: which UUID sits at which placement.
"""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from exporter.sim import Fault
from exporter.workloads import limits
from exporter.workloads.apiserver.slices import SliceIndex
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import PodResourcesClient
from exporter.workloads.mapper import Mapper
from tests.support.fakekubelet import FakeKubelet
from tests.support.simnode import H100, node

DRIVER, POOL, PROFILE = "gpu.nvidia.com", "node-a", "1g.10gb"
FLEET = {"hostname": "node-a", "gpus": [{"model": H100, "mig": [{"profile": "7g.80gb"}]}]}


def _orders(n: int) -> list[tuple[int, ...]]:
    """Creation orders of n placements (0..n-1): all for n <= 3, else six shuffles."""
    if n <= 3:
        return list(itertools.permutations(range(n)))
    rng = random.Random(n)
    return [tuple(rng.sample(range(n), n)) for _ in range(6)]


CASES = [(n, order) for n in (2, 3, 7) for order in _orders(n)]


def _name(start: int) -> str:
    return f"gpu-0-mig-1g10gb-19-{start}"


def _slice(parent: str, starts: list[int], version: str) -> dict:
    """The pool's ResourceSlice with one dynamic MIG device per placement start."""
    devices = []
    for s in starts:
        attrs = {"type": {"string": "mig"}, "parentUUID": {"string": parent}}
        attrs["profile"] = {"string": PROFILE}
        body = {"basic": {"attributes": attrs}} if version == "v1beta1" else {"attributes": attrs}
        devices.append({"name": _name(s), **body})
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu"},
        "spec": {"driver": DRIVER, "pool": {"name": POOL, "generation": 1}, "devices": devices},
    }


def _answer(starts: list[int]) -> pb.ListPodResourcesResponse:
    """One pod per prepared claim; claim-<s> holds the device at placement s."""
    resp = pb.ListPodResourcesResponse()
    for s in starts:
        c = resp.pod_resources.add(name=f"pod-{s}", namespace="ml").containers.add(name="c")
        dr = c.dynamic_resources.add(claim_name=f"claim-{s}", claim_namespace="ml")
        dr.claim_resources.add(driver_name=DRIVER, pool_name=POOL, device_name=_name(s))
    return resp


def _truth(n) -> dict[int, str]:
    """Placement start -> MIG UUID of the live instances, as the simulated driver has them."""
    return {m.spec.start: m.uuid for m in n.driver.gpus[0].migs}


async def _check(n, kubelet, mapper, index, live: list[int], version: str) -> None:
    """Create exactly the instances of ``live`` (in that order), publish and list their
    claims, and check that each claim's pod holds the instance at its placement."""
    mig = [{"profile": PROFILE, "gi": 7 + s} for s in live] or [{"profile": "7g.80gb"}]
    n.driver.inject(Fault("mig_reconfigure", gpu=0, mig=mig))
    snap = n.cycle()
    parent = snap.gpus[0].uuid
    index.replace([_slice(parent, sorted(_truth(n)) if live else [], version)])
    kubelet.pods = _answer(live)
    await mapper.refresh(snap.gpus, [d for d in snap.entities if d.is_mig])
    truth = _truth(n)
    got = {
        o.claim: (key, o.device, o.mig_uuid, o.mig_profile)
        for key, owners in mapper.map.owners.items()
        for o in owners
    }
    want = {f"claim-{s}": (truth[s], _name(s), truth[s], PROFILE) for s in live}
    assert got == want
    assert not mapper.unmatched


@pytest.mark.parametrize(
    ("n", "order"), CASES, ids=[f"{n}-{''.join(map(str, o))}" for n, o in CASES]
)
async def test_same_profile_instances_each_go_to_their_claim(tmp_path, n, order):
    with node(FLEET) as sim_node:
        kubelet = FakeKubelet(tmp_path / "k.sock", pb.ListPodResourcesResponse()).start()
        index = SliceIndex(limits.Drops())
        mapper = Mapper(PodResourcesClient(str(kubelet.socket_path)), (), index.device)
        try:
            live: list[int] = []
            for i, s in enumerate(order):  # created one by one
                live.append(s)
                await _check(sim_node, kubelet, mapper, index, live, ("v1", "v1beta1")[i % 2])
            for s in order[1:] + order[:1]:  # destroyed, in another order
                live.remove(s)
                await _check(sim_node, kubelet, mapper, index, live, "v1")
        finally:
            mapper.close()
            kubelet.close()


async def test_what_cannot_be_told_apart_is_counted_and_logged_once(tmp_path, caplog):
    """Two 1g.10gb instances and a slice device whose name gives no placement: neither is
    guessed; the claim is counted as unmatched each cycle and logged once."""
    with node(FLEET) as sim_node:
        sim_node.driver.inject(
            Fault("mig_reconfigure", gpu=0, mig=[{"profile": PROFILE}, {"profile": PROFILE}])
        )
        snap = sim_node.cycle()
        doc = _slice(snap.gpus[0].uuid, [0], "v1")
        doc["spec"]["devices"][0]["name"] = "mig-a"
        index = SliceIndex(limits.Drops())
        index.replace([doc])
        resp = pb.ListPodResourcesResponse()
        c = resp.pod_resources.add(name="p", namespace="ml").containers.add(name="c")
        dr = c.dynamic_resources.add(claim_name="claim", claim_namespace="ml")
        dr.claim_resources.add(driver_name=DRIVER, pool_name=POOL, device_name="mig-a")
        kubelet = FakeKubelet(tmp_path / "k.sock", resp).start()
        mapper = Mapper(PodResourcesClient(str(kubelet.socket_path)), (), index.device)
        migs = [d for d in snap.entities if d.is_mig]
        try:
            with caplog.at_level(logging.WARNING, "exporter.workloads.mapper"):
                for _ in range(2):
                    await mapper.refresh(snap.gpus, migs)
        finally:
            mapper.close()
            kubelet.close()
    assert len(migs) == 2 and not mapper.map.owners
    assert mapper.unmatched == {"dra:gpu.nvidia.com": 2}
    lines = [r.getMessage() for r in caplog.records if "mig-a" in r.getMessage()]
    assert len(lines) == 1 and "has not exactly one 1g.10gb" in lines[0]
