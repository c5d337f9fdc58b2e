"""workloads/attribution.py with DRA: which containers hold a device their DRA driver calls
unhealthy, by a ResourceSlice taint or by their pod's allocatedResourcesStatus (KEP-4680).
A real gRPC kubelet on a unix socket (the fake kubelet, tests/fixtures/dra/kubelet.yaml's
claims) and a real HTTP API server (the fake one, found through KUBECONFIG)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml

from exporter.config.model import KubeConfig
from exporter.frame import Unhealthy
from exporter.snapshot import Snapshot
from exporter.workloads.attribution import Attribution
from tests.support.dranode import kubeconfig
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FIX = Path(__file__).parents[1] / "fixtures" / "dra"
NODE = "sim-node"
WHOLE = ("ml", "dra-whole", "trainer")  # claim whole-gpu: gpu-3
MIG = ("research", "dra-mig", "notebook")  # claim small-mig: gpu-7-mig-1g10gb-19-7
MIG_DEVICE = "gpu-7-mig-1g10gb-19-7"


def _slices(ids: dict[str, str]) -> list[dict]:
    text = re.sub(
        r"\{([a-z]+:[0-9:]+)\}",
        lambda m: ids[m.group(1)],
        (FIX / "resourceslices.yaml").read_text(),
    )
    return [d for d in yaml.safe_load_all(text) if d]


def _pod(owner: tuple[str, str, str], statuses: list[tuple[str, str, str, str]]) -> dict:
    """The API server's pod of ``owner`` whose containers report (container, claim
    request, device, health) in their allocatedResourcesStatus."""
    namespace, pod, container = owner
    by_container: dict[str, list[dict]] = {}
    for name, request, device, health in statuses:
        resource = {"resourceID": f"gpu.nvidia.com/{NODE}/{device}", "health": health}
        by_container.setdefault(name, []).append({"name": request, "resources": [resource]})
    names = [container, *(c for c in by_container if c != container)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod, "namespace": namespace, "uid": f"uid-{pod}"},
        "spec": {"nodeName": NODE, "containers": [{"name": c} for c in names]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": c,
                    "containerID": f"containerd://{pod}-{c}",
                    "allocatedResourcesStatus": by_container.get(c, []),
                }
                for c in names
            ],
        },
    }


def _named(u: Unhealthy) -> tuple[str, ...]:
    return (u.owner.namespace, u.owner.pod, u.owner.container, u.source, u.reason)


@pytest.fixture
def node(tmp_path, monkeypatch, inventory):
    """(the fake kubelet, the fake API server, a snapshot of the default node's devices)."""
    ids = fleet_ids(None)
    pods = load_pods(FIX / "kubelet.yaml", ids)
    # a second claim on gpu-3, of a pod the API server does not list
    shared = pods.pod_resources.add(name="dra-share", namespace="lab").containers.add(name="c")
    claim = shared.dynamic_resources.add(claim_name="shared-gpu", claim_namespace="lab")
    claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name=NODE, device_name="gpu-3")
    kubelet = FakeKubelet(tmp_path / "k.sock", pods).start()
    slices = _slices(ids)
    for dev in slices[0]["spec"]["devices"]:  # the driver taints the MIG device (XID 79)
        if dev["name"] == MIG_DEVICE:
            dev["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    pods = [
        # gpu-3 Unhealthy, reported twice: one entry
        _pod(WHOLE, [("trainer", "claim:whole-gpu/gpu", "gpu-3", "Unhealthy")] * 2),
        # none of these is dra-mig's notebook's claim's device: another container, another
        # claim, another device, a healthy one
        _pod(
            MIG,
            [
                ("sidecar", "claim:small-mig/gpu", MIG_DEVICE, "Unhealthy"),
                ("notebook", "claim:other/gpu", MIG_DEVICE, "Unhealthy"),
                ("notebook", "claim:small-mig/gpu", "gpu-3", "Unhealthy"),
                ("notebook", "claim:small-mig-2/gpu", MIG_DEVICE, "Unhealthy"),
                ("notebook", "claim:small-mig/gpu", MIG_DEVICE, "Healthy"),
            ],
        ),
    ]
    api = FakeAPIServer(pods=pods, slices=slices).start()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", api.url)))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    gpus, migs = inventory
    snap = Snapshot(
        1.8e9, 0.0, gpus=tuple(gpus.values()), entities=(*gpus.values(), *migs.values())
    )
    yield kubelet, api, snap
    api.stop()
    kubelet.close()


async def test_the_holders_of_a_device_their_driver_calls_unhealthy(node, inventory):
    """GPU 3: dra-whole's pod status says its claim's device is Unhealthy (named once;
    dra-share, under another claim, is not named); the MIG instance: the driver's
    NoSchedule taint names dra-mig, whose pod status names it under another container,
    claim or device only, or healthy."""
    kubelet, _, snap = node
    gpus, migs = inventory
    attr = Attribution(KubeConfig(NODE, str(kubelet.socket_path), dra=True))
    try:
        for _ in range(200):
            await attr.refresh(snap)
            got = attr.unhealthy()
            if gpus[3].key in got and migs[(7, 7)].key in got:
                break
            await asyncio.sleep(0.05)
        named = {key: [_named(u) for u in v] for key, v in got.items()}
        assert named == {
            gpus[3].key: [(*WHOLE, "pod_status", "Unhealthy")],
            migs[(7, 7)].key: [(*MIG, "taint", "gpu.nvidia.com/xid=79")],
        }
    finally:
        await attr.close()


async def test_a_device_two_claims_hold_is_split_between_the_claims(node, inventory):
    """GPU 3 under claims whole-gpu and shared-gpu, whose consumed capacity the API server
    does not list: half each, over two claims (basis "even"), not as time-sliced holders."""
    kubelet, _, snap = node
    gpus, _ = inventory
    attr = Attribution(KubeConfig(NODE, str(kubelet.socket_path), dra=True))
    try:
        for _ in range(200):
            await attr.refresh(snap)
            if attr.watcher is not None and attr.watcher.synced:
                break
            await asyncio.sleep(0.05)
        await attr.refresh(snap)
        use = attr.usage(snap)[gpus[3].key]
        assert [(c.pod, c.share) for c in use.claims] == [("dra-whole", 0.5), ("dra-share", 0.5)]
        assert (use.replicas, use.basis) == (2, "even")
    finally:
        await attr.close()
