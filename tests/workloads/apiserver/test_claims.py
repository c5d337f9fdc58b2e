"""ResourceClaims sharing a device by consumed capacity (KEP-5075): parsing, bounds, watch."""

from __future__ import annotations

import time

import pytest

from exporter.sim.resourceslices import resource_claim
from exporter.workloads import limits
from exporter.workloads.apiserver import claims as claims_mod
from exporter.workloads.apiserver.apiclient import ApiClient
from exporter.workloads.apiserver.claims import ClaimIndex, capacities, parse_claim, quantity
from exporter.workloads.apiserver.kubeconfig import ClusterConfig
from exporter.workloads.apiserver.slices import parse_slice
from exporter.workloads.apiserver.watch import PodWatcher, Timing
from exporter.workloads.limits import Drops
from tests.support.fakeapi import FakeAPIServer

GPU0 = ("gpu.nvidia.com", "node-a", "gpu-0")
FAST = Timing(backoff_initial_s=0.05, backoff_max_s=0.2, watch_timeout_s=2, read_grace_s=2)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("40Gi", 40 * 2**30),
        ("81559Mi", 81559 * 2**20),
        ("500m", 0.5),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("2k", 2000.0),
        ("3M", 3e6),
        (".5Ki", 512.0),
        (7, 7.0),
    ],
)
def test_quantities_as_kubernetes_writes_them(text, want):
    assert quantity(text) == pytest.approx(want)


@pytest.mark.parametrize(
    "bad", ["", "Gi", "40GB", "1e", "x" * 100, None, True, [], "1e9999", "1e999", "-1e-999"]
)
def test_what_is_no_quantity_is_none(bad):
    assert quantity(bad) is None


def test_a_claims_consumption_per_device():
    obj = resource_claim("big", "ml", "node-a", "gpu-0", {"memory": "40Gi", "cores": "50"})
    key, devices = parse_claim(obj, Drops())
    assert key == ("ml", "big")
    assert dict(devices[GPU0]) == {"memory": 40 * 2**30, "cores": 50.0}


def test_two_results_on_one_device_add_up_and_a_claim_without_capacity_is_left_out():
    obj = resource_claim("two", "ml", "node-a", "gpu-0", {"memory": "10Gi"})
    results = obj["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "consumedCapacity": {"memory": "6Gi"}})
    results.append({"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"})  # whole
    _, devices = parse_claim(obj, Drops())
    assert list(devices) == [GPU0] and devices[GPU0]["memory"] == 16 * 2**30
    index = ClaimIndex(Drops())
    plain = resource_claim("plain", "ml", "node-a", "gpu-1", {})
    index.replace([obj, plain])
    assert len(index) == 1 and index.consumed("ml", "plain", GPU0) is None


def test_the_claims_kept_and_results_read_are_bounded(monkeypatch):
    monkeypatch.setattr(limits, "MAX_CLAIMS", 3)
    drops = Drops()
    index = ClaimIndex(drops)
    index.replace(
        [resource_claim(f"c{i}", "ml", "node-a", "gpu-0", {"memory": "1Gi"}) for i in range(5)]
    )
    assert len(index) == 3 and drops["claims"] == 2
    obj = resource_claim("many", "ml", "node-a", "gpu-0", {"memory": "1Gi"})
    one = obj["status"]["allocation"]["devices"]["results"][0]
    many = claims_mod.MAX_RESULTS + 5
    obj["status"]["allocation"]["devices"]["results"] = [
        {**one, "device": f"gpu-{i}"} for i in range(many)
    ]
    _, devices = parse_claim(obj, drops)
    assert len(devices) == claims_mod.MAX_RESULTS and drops["claim_results"] == 1


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_slice_device_publishes_its_capacity_and_sharing(version):
    from exporter.sim.resourceslices import resource_slice

    class Gpu:  # what resource_slice reads of a simulated GPU
        index, uuid, mig_enabled, migs = 0, "GPU-0", False, ()

        class model:
            memory_mib = 81559

    doc = resource_slice([Gpu()], "node-a", version, shared=("gpu-0",))
    _, _, _, (dev,) = parse_slice(doc, 10, Drops())
    assert dev.capacity == (("memory", 81559 * 2**20),)
    assert dev.shared is (version == "v1")  # v1beta1 has no allowMultipleAllocations
    assert capacities({"memory": {"value": "0"}, "x": {"value": "bad"}, "": {"value": 1}}) == ()


def test_the_watcher_follows_claims_added_changed_and_deleted():
    big = resource_claim("big", "ml", "node-a", "gpu-0", {"memory": "40Gi"})
    with FakeAPIServer([], [], claims=[big]) as api:
        w = PodWatcher(
            "node-a", api_client=ApiClient(ClusterConfig(server=api.url)), dra=True, timing=FAST
        )
        w.start()
        try:
            _wait(lambda: w.claim_consumed("ml", "big", GPU0) is not None)
            assert w.claim_consumed("ml", "big", GPU0) == {"memory": 40 * 2**30}
            api.add(resource_claim("small", "lab", "node-a", "gpu-0", {"memory": "8Gi"}))
            _wait(lambda: w.claim_consumed("lab", "small", GPU0) is not None)
            api.modify(resource_claim("big", "ml", "node-a", "gpu-0", {"memory": "20Gi"}))
            _wait(lambda: w.claim_consumed("ml", "big", GPU0) == {"memory": 20 * 2**30})
            api.delete(big)
            _wait(lambda: w.claim_consumed("ml", "big", GPU0) is None)
            assert w.claim_consumed("lab", "small", GPU0) == {"memory": 8 * 2**30}
            assert w.status == ""
            # cluster-wide: no field selector names a node
            queries = [q for p, q in api.requests if p.endswith("/resourceclaims")]
            assert queries and all(not q.get("fieldSelector") for q in queries)
        finally:
            w.stop()


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        {"metadata": "x", "status": []},
        {"metadata": {"name": "c", "namespace": "ml"}, "status": {"allocation": {"devices": 3}}},
        {
            "metadata": {"name": "c", "namespace": "ml"},
            "status": {"allocation": {"devices": {"results": [None, 1, {"consumedCapacity": 2}]}}},
        },
        {
            "metadata": {"name": "c" * 300, "namespace": "ml"},
            "status": {"allocation": {"devices": {"results": [{"consumedCapacity": {"m": "1"}}]}}},
        },
    ],
)
def test_a_malformed_claim_is_no_claim(obj):
    index = ClaimIndex(Drops())
    index.replace([obj])
    index.event("ADDED", obj)
    index.event("DELETED", obj)
    assert len(index) == 0
