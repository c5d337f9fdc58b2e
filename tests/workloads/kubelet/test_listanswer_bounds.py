"""Every bound of a kubelet List answer is applied while it is decoded: past a bound,
entries are never handed to protobuf, and they are counted by input."""

from __future__ import annotations

from collections import Counter

from exporter.workloads import limits
from exporter.workloads.kubelet import listanswer
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import MAX_MESSAGE


def decode(resp: pb.ListPodResourcesResponse) -> tuple[pb.ListPodResourcesResponse, Counter]:
    raw = resp.SerializeToString()
    assert len(raw) <= MAX_MESSAGE  # what the client takes in
    return listanswer.decode(raw)


def test_two_million_empty_pods_become_two_thousand_messages() -> None:
    raw = b"\x0a\x00" * (MAX_MESSAGE // 2)  # 4 MiB: 2,097,152 empty PodResources
    got, drops = listanswer.decode(raw)
    assert len(got.pod_resources) == limits.MAX_KUBELET_PODS
    assert got.ByteSize() == 2 * limits.MAX_KUBELET_PODS  # those pods' bytes, nothing else
    # each entry past the bound is counted while the walk has fields left; then it stops
    assert drops == Counter(
        kubelet_pods=limits.MAX_LIST_FIELDS - limits.MAX_KUBELET_PODS, kubelet_fields=1
    )


def test_pods_past_the_bound_are_dropped_and_counted() -> None:
    resp = pb.ListPodResourcesResponse()
    for i in range(limits.MAX_KUBELET_PODS + 500):
        c = resp.pod_resources.add(name=f"p-{i}", namespace="ns").containers.add(name="m")
        c.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"GPU-{i}"])
    got, drops = decode(resp)
    assert drops == Counter(kubelet_pods=500)
    kept = pb.ListPodResourcesResponse(pod_resources=resp.pod_resources[: limits.MAX_KUBELET_PODS])
    assert got.SerializeToString() == kept.SerializeToString()  # those pods, nothing else


def test_containers_are_bounded_per_pod() -> None:
    resp = pb.ListPodResourcesResponse()
    for n in (limits.MAX_CONTAINERS_PER_POD + 10, 5, limits.MAX_CONTAINERS_PER_POD):
        pod = resp.pod_resources.add(name=f"p{n}", namespace="ns")
        for i in range(n):
            pod.containers.add(name=f"c{i}")
    got, drops = decode(resp)
    assert drops == Counter(containers=10)
    assert [len(p.containers) for p in got.pod_resources] == [128, 5, 128]
    assert got.pod_resources[0].containers[-1].name == "c127"  # the first ones are kept


def test_device_entries_are_bounded_per_answer() -> None:
    resp = pb.ListPodResourcesResponse()
    for _ in range(2):  # device-plugin entries and DRA claims share the bound
        c = resp.pod_resources.add(name="p", namespace="ns").containers.add(name="m")
        for i in range(limits.MAX_DEVICE_ENTRIES // 2):
            c.devices.add(resource_name=f"r{i}")
        c.dynamic_resources.add(claim_name="claim")
    got, drops = decode(resp)
    assert drops == Counter(device_entries=2)
    kept = [c for p in got.pod_resources for c in p.containers]
    half = limits.MAX_DEVICE_ENTRIES // 2  # the first container's entries and claim, then ...
    assert [(len(c.devices), len(c.dynamic_resources)) for c in kept] == [
        (half, 1),
        (half - 1, 0),  # ... up to the bound: the last device and the claim go
    ]


def test_device_ids_are_bounded_per_answer_dra_devices_included() -> None:
    resp = pb.ListPodResourcesResponse()
    for i in range(3):
        c = resp.pod_resources.add(name=f"p{i}", namespace="ns").containers.add(name="m")
        c.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"GPU-{j}" for j in range(8000)])
    claim = resp.pod_resources[2].containers[0].dynamic_resources.add(claim_name="claim")
    claim.claim_resources.add(driver_name="gpu.nvidia.com", device_name="gpu-0").cdi_devices.add(
        name="k8s.gpu.nvidia.com/device=gpu-0"
    )
    got, drops = decode(resp)
    # 20,000 kept: 8,000 + 8,000 + 4,000; then the claim's device (its CDI name goes with it)
    assert drops == Counter(device_ids=24_000 + 1 - limits.MAX_DEVICE_IDS)
    kept = [len(p.containers[0].devices[0].device_ids) for p in got.pod_resources]
    assert kept == [8000, 8000, 4000]
    assert len(got.pod_resources[2].containers[0].dynamic_resources[0].claim_resources) == 0


def test_the_walk_stops_at_its_field_budget_keeping_whole_pods() -> None:
    resp = pb.ListPodResourcesResponse()
    for i in range(limits.MAX_LIST_FIELDS // 100):
        pod = resp.pod_resources.add(name=f"p-{i}", namespace="ns")
        for _ in range(100):
            pod.containers.add()  # an empty container: one field
    got, drops = decode(resp)
    assert drops == Counter(kubelet_fields=1)
    fields_per_pod = 1 + 2 + 100  # the entry, its name and namespace, its containers
    n = limits.MAX_LIST_FIELDS // fields_per_pod
    assert list(got.pod_resources) == list(resp.pod_resources)[:n]  # whole pods, in order


def test_a_dra_devices_cdi_names_count_as_device_ids() -> None:
    resp = pb.ListPodResourcesResponse()
    c = resp.pod_resources.add(name="p", namespace="ns").containers.add(name="m")
    ids = [f"GPU-{j}" for j in range(limits.MAX_DEVICE_IDS - 1)]
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=ids)
    device = c.dynamic_resources.add(claim_name="claim").claim_resources.add(
        driver_name="gpu.nvidia.com", device_name="gpu-0"
    )
    device.cdi_devices.add(name="k8s.gpu.nvidia.com/device=gpu-0")
    got, drops = decode(resp)
    # the DRA device is the last ID within the bound; its CDI name is one past it
    assert drops == Counter(device_ids=1)
    kept = got.pod_resources[0].containers[0].dynamic_resources[0].claim_resources
    assert [(r.device_name, len(r.cdi_devices)) for r in kept] == [("gpu-0", 0)]


def test_the_field_budget_counts_cdi_names_at_the_deepest_level() -> None:
    # the first pod: its entry, container, claim, then per CDI name its device, its CDI
    # entry and the name; each other pod: its entry, name, namespace and 100 containers
    cdi_names, pods = 9947, 1652  # within the device-ID and pod bounds
    assert 3 + 3 * cdi_names + pods * (1 + 2 + 100) == limits.MAX_LIST_FIELDS
    resp = pb.ListPodResourcesResponse()
    device = resp.pod_resources.add().containers.add().dynamic_resources.add()
    for i in range(cdi_names):
        device.claim_resources.add().cdi_devices.add(name=f"cdi/device={i}")
    for i in range(pods):
        pod = resp.pod_resources.add(name=f"p-{i}", namespace="ns")
        for _ in range(100):
            pod.containers.add()  # an empty container: one field
    got, drops = decode(resp)
    assert got == resp and drops == Counter()  # every field within the budget
    # one more pod: one field past it
    got, drops = listanswer.decode(resp.SerializeToString() + bytes([0x0A, 0x00]))
    assert got == resp and drops == Counter(kubelet_fields=1)
