"""A broken or hostile API server (real HTTP on 127.0.0.1, through the exporter's API
client) cannot grow the pod watcher's memory or log without bound, and a tenant's pod
labels cannot bloat the exposition or overwrite the exporter's own labels."""

from __future__ import annotations

import pytest

from exporter.workloads import limits
from exporter.workloads.apiserver.watch import PodWatcher
from tests.support import hostileapi
from tests.support.hostileapi import HostileAPIServer, events, pod, pod_list
from tests.workloads.apiserver.test_watch import FAST, client_for, wait_until
from tests.workloads.test_mapper_hostile import rss_mib, warnings


def once(chunks):
    """A watch answer that is sent the first time only; later watches are empty."""
    left = [chunks]
    return lambda: left.pop() if left else iter(())


@pytest.fixture
def api():
    with HostileAPIServer() as srv:
        yield srv


@pytest.fixture
def watcher():
    made = []

    def make(url, **kw):
        w = PodWatcher("node-a", api_client=client_for(url), timing=FAST, **kw)
        made.append(w)
        w.start()
        return w

    yield make
    for w in made:
        w.stop()


def test_list_of_100000_pods_is_refused_not_held(api, watcher, caplog):
    api.lists = lambda: pod_list(100_000)  # about 20 MB
    before = rss_mib()
    w = watcher(api.url)
    wait_until(lambda: api.count("list") >= 3, what="three list attempts")
    assert w.drops["list_bytes"] >= 2
    assert "larger than" in w.status
    assert w.pods() == []
    assert rss_mib() - before < 48
    assert len(warnings(caplog)) <= limits.LOG_LINES_PER_MINUTE + 1
    api.lists = lambda: pod_list(3)  # a sane answer again: the watcher recovers
    wait_until(lambda: len(w.pods()) == 3 and w.status == "", what=lambda: w.status)


def test_100000_pods_through_the_watch_keep_the_index_bounded(api, watcher):
    api.lists = lambda: pod_list(0)
    api.watches = once(events(pod(i) for i in range(100_000)))
    before = rss_mib()
    w = watcher(api.url)
    wait_until(lambda: w.drops["pods"] == 100_000 - limits.MAX_PODS, timeout=60, what="all events")
    assert len(w.pods()) == limits.MAX_PODS
    assert w.pod_by_name("ns", "p-0") is not None and w.pod_by_name("ns", "p-99999") is None
    assert rss_mib() - before < 48


def test_watch_line_without_newline(api, watcher, caplog):
    api.lists = lambda: pod_list(2)
    api.watches = once(b"x" * 65536 for _ in range(400))  # 25 MiB, no newline
    before = rss_mib()
    w = watcher(api.url)
    wait_until(lambda: w.drops["watch_line"] == 1, timeout=30, what="the cut")
    wait_until(lambda: api.count("list") >= 2, what="a new list after the cut")
    assert len(w.pods()) == 2  # pods stay known throughout
    assert rss_mib() - before < 48
    cut = [m for m in warnings(caplog) if "longer than" in m]
    assert len(cut) == 1


def labelled(i: int, labels: dict[str, str]) -> bytes:
    return b'{"metadata":{"resourceVersion":"1"},"items":[%s]}' % (
        hostileapi.json.dumps(pod(i, labels)).encode()
    )


def test_20000_pod_labels_are_capped(api, watcher):
    many = {f"team.example.com/l{i:05d}": "v" * 100 for i in range(20_000)}
    api.lists = lambda: iter([labelled(0, many)])
    w = watcher(api.url, copy_labels=True)
    wait_until(lambda: w.pods_synced)
    labels = w.pod_by_name("ns", "p-0").labels
    assert len(labels) == limits.MAX_POD_LABELS
    assert min(labels) == "team_example_com_l00000"
    assert w.drops["pod_labels"] == 20_000 - limits.MAX_POD_LABELS


def test_copied_labels_never_take_the_exporters_own_names(api, watcher):
    own = {
        "pod": "evil",
        "namespace": "evil",
        "UUID": "GPU-evil",
        "gpu": "9",
        "__name__": "x",
        "app.kubernetes.io/name": "trainer",
        "1st": "digit",
        "n" * 300: "long name",
        "big": "v" * 1000,
    }
    api.lists = lambda: iter([labelled(0, own)])
    w = watcher(api.url, copy_labels=True, label_allow="app.*")
    wait_until(lambda: w.pods_synced)
    labels = dict(w.pod_by_name("ns", "p-0").labels)
    assert labels == {
        "_1st": "digit",
        "app_kubernetes_io_name": "trainer",
        "label_app_kubernetes_io_name": "trainer",  # our own --kubernetes-pod-labels too
        "big": "v" * limits.MAX_LABEL_VALUE_CHARS,
    }
    assert w.drops["pod_label_reserved"] == 5
    assert w.drops["pod_label_name"] == 1
    assert w.drops["pod_label_value"] == 1


def test_allowlist_regexes_pick_labels(api, watcher):
    labels = {"app": "a", "team": "t", "tier": "x", "other": "o"}
    api.lists = lambda: iter([labelled(0, labels)])
    w = watcher(api.url, copy_labels=True, label_allowlist=("^app$", "^t"))
    wait_until(lambda: w.pods_synced)
    assert dict(w.pod_by_name("ns", "p-0").labels) == {"app": "a", "team": "t", "tier": "x"}


def test_annotation_churn_keeps_memory_flat(api, watcher, caplog):
    api.lists = lambda: pod_list(10)
    churn = (pod(i % 10, mirror=f"{i:032x}") for i in range(20_000))  # 2 KB annotations each
    api.watches = once(events(churn, kind="MODIFIED"))
    before = rss_mib()
    w = watcher(api.url)
    wait_until(lambda: w.pod(f"{19_999:032x}") is not None, timeout=60, what="the last event")
    assert w.pod(f"{19_989:032x}") is None  # an old mirror UID does not linger
    uids, names = w.index.sizes()
    assert (uids, names) == (20, 10)  # ten pods, each with its UID and its mirror UID
    assert rss_mib() - before < 32
    assert not warnings(caplog)
