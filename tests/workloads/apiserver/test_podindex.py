"""The pod index's container times: what accounting pro-rates short pods by."""

from __future__ import annotations

from datetime import UTC, datetime

from exporter.workloads.apiserver.podindex import LabelPolicy, PodIndex
from exporter.workloads.limits import Drops


def _unix(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _pod(statuses: list) -> dict:
    meta = {"uid": "u1", "name": "p", "namespace": "ns"}
    return {"metadata": meta, "status": {"containerStatuses": statuses}}


def test_running_and_terminated_containers_give_their_start_and_end() -> None:
    index = PodIndex(LabelPolicy(), Drops())
    running = {"running": {"startedAt": "2026-05-01T10:01:00Z"}}
    ended = {
        "terminated": {"startedAt": "2026-05-01T10:01:02Z", "finishedAt": "2026-05-01T10:01:12Z"}
    }
    index.replace([_pod([{"name": "a", "state": running}, {"name": "b", "state": ended}])])
    info = index.pod_by_name("ns", "p")
    assert info is not None
    assert info.times["a"] == (_unix("2026-05-01T10:01:00Z"), None)
    assert info.times["b"] == (_unix("2026-05-01T10:01:02Z"), _unix("2026-05-01T10:01:12Z"))
    # a MODIFIED event carries the end
    index.event("MODIFIED", _pod([{"name": "a", "state": ended}]))
    info = index.pod_by_name("ns", "p")
    assert info is not None and info.times["a"][1] == _unix("2026-05-01T10:01:12Z")


def test_times_that_are_not_rfc_3339_are_not_known() -> None:
    index = PodIndex(LabelPolicy(), Drops())
    bad = [
        {"name": "a", "state": {"running": {"startedAt": "yesterday"}}},
        {"name": "b", "state": {"running": {"startedAt": 1777629660}}},
        {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}},
        {"name": "d", "state": {"running": {"startedAt": "2026-05-01T10:01:00Z" + "0" * 40}}},
    ]
    index.replace([_pod(bad)])
    info = index.pod_by_name("ns", "p")
    assert info is not None
    assert info.times == {"a": (None, None), "b": (None, None), "d": (None, None)}
