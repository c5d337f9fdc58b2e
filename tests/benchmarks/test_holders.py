"""benchmarks/holders.py: the kubelet answer it serves and the self-metrics it reads."""

from __future__ import annotations

from benchmarks.holders import answer, families, self_metrics
from benchmarks.kubelet import response
from exporter.workloads import limits
from exporter.workloads.kubelet.podresources import parse


def test_the_answer_lists_every_holder_within_the_kubelet_bounds() -> None:
    """20,000 containers, each on a replica of its own, spread over the devices in turn;
    the exporter's bounded decoder keeps all of them (a drop would make fewer holders)."""
    ids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(19)]
    got, drops = parse(response(answer(ids, 20_000, 100)).SerializeToString())
    assert not drops
    assert len(got.pod_resources) == 200
    held = [d for p in got.pod_resources for c in p.containers for d in c.devices]
    replicas = [r for d in held for r in d.device_ids]
    assert len(replicas) == len(set(replicas)) == 20_000 <= limits.MAX_DEVICE_IDS
    per_device = {i: sum(r.startswith(i + "::") for r in replicas) for i in ids}
    assert set(per_device.values()) <= {1052, 1053}  # 20,000 / 19, in turn
    assert max(len(p.containers) for p in got.pod_resources) <= limits.MAX_CONTAINERS_PER_POD


def test_self_metrics_are_read_from_the_exposition() -> None:
    body = (
        b"# HELP gpu_exporter_collections_total Collection cycles by result.\n"
        b'gpu_exporter_collections_total{result="success"} 41.0\n'
        b'gpu_exporter_collections_total{result="failure"} 2.0\n'
        b"gpu_exporter_last_collection_success_timestamp_seconds 1.8e+09\n"
        b'gpu_exporter_accounting_holders_dropped_total{reason="limit"} 11808.0\n'
        b'gpu_exporter_allocated_gpu_seconds_total{gpu="0",pod="a"} 1.000\n'
        b'gpu_exporter_allocated_gpu_seconds_total{gpu="1",pod="b"} 1.000\n'
    )
    assert self_metrics(body) == {
        "success": 41.0,
        "failure": 2.0,
        "last_success": 1.8e9,
        "dropped_limit": 11808.0,
    }
    assert families(body)["gpu_exporter_allocated_gpu_seconds_total"] == 2
