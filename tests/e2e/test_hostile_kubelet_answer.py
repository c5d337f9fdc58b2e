"""The exporter against a kubelet whose List answer is the worst the 4 MiB cap allows for
memory: the node's real pods, then two million empty pod entries (each one a message to
protobuf). The answer changes every call, so every cycle decodes it again. The exporter
keeps its pod labels, its memory, its scrapes and its cycles."""

from __future__ import annotations

import threading
import time

import pytest

from exporter.workloads import limits
from exporter.workloads.kubelet.podresources import MAX_MESSAGE
from tests.procs import Exporter, http_get
from tests.support.exposition import find
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

pytestmark = pytest.mark.slow

INTERVAL_MS = 300
WATCH_S = 8.0


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "kubelet.sock", load_pods("default-node.yaml", fleet_ids(None)))
    yield k.start()
    k.close()


def hostile(good: bytes, variant: int) -> bytes:
    """``good``'s pods, then empty pod entries up to the message cap; ``variant`` changes
    the last entry, so that two answers differ (and each is decoded)."""
    empty = (MAX_MESSAGE - len(good) - 4) // 2
    return good + b"\x0a\x00" * empty + b"\x0a\x02\x0a" + bytes([0x30 + variant])


class Scrapes(threading.Thread):
    """Scrapes /metrics back to back; notes the slowest and the exporter's RSS peak."""

    def __init__(self, node: Exporter) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.stop = threading.Event()
        self.times: list[float] = []
        self.rss_peak = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            status, _, _ = http_get(self.node.url + "/metrics", timeout=5)
            self.times.append(time.perf_counter() - t0)
            assert status == 200
            self.rss_peak = max(self.rss_peak, self.node.rss_mib())
            time.sleep(0.02)


def test_a_4_mib_answer_of_empty_pods(tmp_path, kubelet):
    good = kubelet.pods.SerializeToString()
    node = Exporter(
        "-c", str(INTERVAL_MS), "-k", "--pod-resources-kubelet-socket",
        str(kubelet.socket_path), log=tmp_path / "log",
    )  # fmt: skip
    try:
        node.wait_ready()
        node.wait_metrics(lambda t: 'pod="train-0"' in t, 15, "pod labels")
        time.sleep(2)
        before = node.rss_mib()
        first = find(node.metrics(), "gpu_exporter_last_collection_success_timestamp_seconds")
        calls = kubelet.calls
        kubelet.raw = [hostile(good, 0), hostile(good, 1)]
        watch = Scrapes(node)
        watch.start()
        time.sleep(WATCH_S)
        watch.stop.set()
        watch.join(10)
        text = node.metrics()
        log = node.output()
    finally:
        node.stop()
    decoded = kubelet.calls - calls
    last = find(text, "gpu_exporter_last_collection_success_timestamp_seconds")
    dropped = {
        s.labels["input"]: s.value for s in find(text, "gpu_exporter_kube_inputs_dropped_total")
    }
    print(
        f"\n4 MiB of empty pods, {decoded} answers decoded in {WATCH_S:.0f} s: RSS {before:.1f} "
        f"-> peak {watch.rss_peak:.1f} MiB; {len(watch.times)} scrapes, slowest "
        f"{max(watch.times) * 1000:.0f} ms; dropped {dropped}"
    )
    assert decoded >= 5  # every cycle asked, and each answer differed from the last
    assert watch.rss_peak - before < 48
    assert max(watch.times) < 1.0
    assert last[0].value > first[0].value + WATCH_S / 2  # fresh cycles all along
    assert 'pod="train-0"' in text  # the real pods come first: still attributed
    assert find(text, "gpu_exporter_kubelet_up")[0].value == 1
    assert dropped["kubelet_pods"] >= limits.MAX_LIST_FIELDS - limits.MAX_KUBELET_PODS
    assert dropped["kubelet_fields"] >= 1
    assert "Traceback" not in log
