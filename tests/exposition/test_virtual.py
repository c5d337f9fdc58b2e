"""--kubernetes-virtual-gpus: exposition on hand-made snapshots, holders and splits; replica IDs."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from exporter.catalog.metricsfile import parse
from exporter.frame import Holder, Owner, Split
from exporter.workloads.ids import Resolver
from exporter.workloads.mapper import REPLICAS_MAX, Mapper
from exporter.workloads.sharing import UNATTRIBUTED
from tests.exposition.test_build import CATALOG, gpu, mig, snap
from tests.support.exposition import Stages, samples

A = Owner("batch", "a", "worker")
B = Owner("batch", "b", "worker")


def shared_node():
    """GPU 0 shared by a and b; GPU 1 held by a alone; GPU 2 in MIG mode, GI 3 shared."""
    g0, g1, g2 = gpu(0), gpu(1), gpu(2)
    m3 = mig(g2, 3)
    values = {
        g0.key: {
            "DCGM_FI_DEV_POWER_USAGE": 300.5,
            "DCGM_FI_DEV_GPU_UTIL": 90,
            "DCGM_FI_DEV_FB_USED": 30,
        },
        g1.key: {"DCGM_FI_DEV_POWER_USAGE": 100.0, "DCGM_FI_DEV_GPU_UTIL": 10},
        g2.key: {"DCGM_FI_DEV_POWER_USAGE": 200.0},
        m3.key: {"DCGM_FI_DEV_FB_USED": 7},
    }
    s = snap([g0, g1, g2], entities=[g0, g1, m3], values=values)
    return s, g0, g1, m3


def render(s, holders, splits, sharers):
    b = Stages()
    n = b.publish(s, CATALOG, holders, splits, sharers)
    got = samples(b.text)
    assert n == len(got)
    keys = Counter((x.name, tuple(sorted(x.labels.items()))) for x in got)
    assert max(keys.values()) == 1  # never two series with the same labels
    return got


def pick(got, name, gpu_index, **labels):
    return [
        x
        for x in got
        if x.name == name
        and x.labels["gpu"] == gpu_index
        and all(x.labels.get(k) == v for k, v in labels.items())
    ]


def test_device_values_repeat_per_holder_and_per_process_fields_split():
    s, g0, g1, m3 = shared_node()
    holders = {g1.key: Holder(A, "uid-a")}
    sharers = {
        g0.key: (Holder(A, "uid-a", vgpu="0"), Holder(B, "uid-b", vgpu="1,2")),
        m3.key: (Holder(A), Holder(B)),
    }
    splits = [
        Split(g0, fb={A: 20.0, B: 0.0, UNATTRIBUTED: 10.0}, sm={A: 55.0, B: 0.0}),
        Split(m3, fb={A: 7.0, B: 0.0}),
    ]
    got = render(s, holders, splits, sharers)
    power = pick(got, "DCGM_FI_DEV_POWER_USAGE", "0")
    assert {(x.labels["pod"], x.labels["pod_uid"], x.labels["vgpu"], x.value) for x in power} == {
        ("a", "uid-a", "0", 300.5),
        ("b", "uid-b", "1,2", 300.5),
    }
    util = {x.labels.get("pod"): x.value for x in pick(got, "DCGM_FI_DEV_GPU_UTIL", "0")}
    assert util == {None: 90, "a": 55.0, "b": 0.0}
    fb = {x.labels.get("pod"): x.value for x in pick(got, "DCGM_FI_DEV_FB_USED", "0")}
    assert fb == {None: 30, "a": 20.0, "b": 0.0}  # unattributed memory: only in the total
    # a shared MIG instance: the parent's device-level value per holder, its own memory split
    mig_power = pick(got, "DCGM_FI_DEV_POWER_USAGE", "2", GPU_I_ID="3")
    assert sorted(x.labels["pod"] for x in mig_power) == ["a", "b"]
    mig_fb = {x.labels.get("pod"): x.value for x in pick(got, "DCGM_FI_DEV_FB_USED", "2")}
    assert mig_fb == {None: 7, "a": 7.0, "b": 0.0}
    # a GPU held by one container: as without the flag
    one = pick(got, "DCGM_FI_DEV_GPU_UTIL", "1")
    assert [(x.labels["pod"], x.value) for x in one] == [("a", 10)]


def test_without_a_join_per_process_fields_keep_only_the_device_series():
    s, g0, _, _ = shared_node()
    sharers = {g0.key: (Holder(A), Holder(B))}
    splits = [Split(g0, fb={UNATTRIBUTED: 30.0}, sm={UNATTRIBUTED: 90.0})]
    got = render(s, {}, splits, sharers)
    assert [x.labels.get("pod") for x in pick(got, "DCGM_FI_DEV_GPU_UTIL", "0")] == [None]
    assert [x.labels.get("pod") for x in pick(got, "DCGM_FI_DEV_FB_USED", "0")] == [None]
    assert len(pick(got, "DCGM_FI_DEV_POWER_USAGE", "0")) == 2


def test_off_keeps_one_unlabelled_series_per_shared_gpu():
    s, g0, _, _ = shared_node()
    splits = [Split(g0, fb={A: 20.0, B: 0.0}, sm={A: 55.0, B: 0.0})]
    got = render(s, {}, splits, None)
    assert [x.labels.get("pod") for x in pick(got, "DCGM_FI_DEV_POWER_USAGE", "0")] == [None]
    assert [x.labels.get("pod") for x in pick(got, "DCGM_FI_DEV_GPU_UTIL", "0")] == [None]


def kubelet_answer(*containers):
    """A pod-resources List answer: (pod, container, device IDs) per container."""
    pods = [
        SimpleNamespace(
            namespace="batch",
            name=pod,
            containers=[
                SimpleNamespace(
                    name=name,
                    devices=[SimpleNamespace(resource_name="nvidia.com/gpu", device_ids=ids)],
                    dynamic_resources=[],
                )
            ],
        )
        for pod, name, ids in containers
    ]
    return SimpleNamespace(pod_resources=pods)


def test_replica_ids_are_kept_per_container_and_bounded():
    g = gpu(0, uuid="GPU-0123abcd-0000")
    many = [f"{g.uuid}::{i}" for i in range(40)]
    resp = kubelet_answer(
        ("a", "worker", [f"{g.uuid}::0"]),
        ("b", "worker", [f"{g.uuid}::1", f"{g.uuid}::2", f"{g.uuid}::1"]),
        ("c", "worker", many),
        ("d", "worker", [f"{g.uuid}::{'9' * 40}"]),  # too long to be a replica number
    )
    pm = Mapper(client=None).build(resp, Resolver([g], []))
    reps = pm.replicas[g.key]
    assert reps[Owner("batch", "a", "worker")] == ("0",)
    assert reps[Owner("batch", "b", "worker")] == ("1", "2")
    assert len(reps[Owner("batch", "c", "worker")]) == REPLICAS_MAX
    assert Owner("batch", "d", "worker") not in reps
    assert len(pm.owners[g.key]) == 4


def _shared_by_a_and_b(values: dict[str, float], dcgm47: bool) -> dict[str, dict]:
    """Each listed family's value by pod (None: the device's own series) on GPU 0, shared
    by pods a and b (a: 20 MiB, 55 % SM; b: nothing)."""
    g0 = gpu(0)
    s = snap([g0], values={g0.key: values})
    catalog = parse("".join(f"{name}, gauge, x\n" for name in values), dcgm47=dcgm47)
    sharers = {g0.key: (Holder(A, "uid-a"), Holder(B, "uid-b"))}
    splits = [Split(g0, fb={A: 20.0, B: 0.0}, sm={A: 55.0, B: 0.0})]
    b = Stages()
    b.publish(s, catalog, {}, splits, sharers)
    got = samples(b.text)
    return {n: {x.labels.get("pod"): x.value for x in pick(got, n, "0")} for n in values}


def test_dcgm_4_7_names_split_the_same_shares_in_their_units():
    """GPU_UTIL_RATIO and FB_USED_BYTES (dcgm-exporter 4.9) split as GPU_UTIL and FB_USED."""
    values = {"DCGM_FI_DEV_GPU_UTIL_RATIO": 0.9, "DCGM_FI_DEV_FB_USED_BYTES": 30 << 20}
    got = _shared_by_a_and_b(values, dcgm47=True)
    assert got["DCGM_FI_DEV_GPU_UTIL_RATIO"] == {None: 0.9, "a": 0.55, "b": 0.0}
    assert got["DCGM_FI_DEV_FB_USED_BYTES"] == {None: 30 << 20, "a": 20 << 20, "b": 0.0}


def test_dcgm_4_6s_gpu_util_ratio_splits_in_percent():
    """Before 4.9 GPU_UTIL_RATIO is DCGM 4.6's alias of GPU_UTIL (0-100): its pod shares too."""
    got = _shared_by_a_and_b({"DCGM_FI_DEV_GPU_UTIL_RATIO": 90}, dcgm47=False)
    assert got["DCGM_FI_DEV_GPU_UTIL_RATIO"] == {None: 90, "a": 55, "b": 0}
