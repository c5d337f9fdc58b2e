"""An NVML call that hangs for 60 s, end to end (about 70 s of wall time).

While the worker thread is stuck: every scrape is answered at once from the last
snapshot, the self-metrics show it is stale, /ready names the stuck call, and no
thread is added however long it lasts. Once the call returns, the next cycle
collects again, with the slow GPU set aside and every other GPU fresh.
tests/e2e/test_faults.py covers a 4 s hang with its /ready details.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime

from tests.procs import ROOT, Exporter, http_get, wait_until
from tests.support.exposition import find

FIXTURES = ROOT / "tests" / "fixtures" / "reliability"

HANG_S = 60


def scrape(node: Exporter) -> tuple[float, str]:
    t0 = time.perf_counter()
    status, headers, body = http_get(node.url + "/metrics", timeout=2.0)
    took = time.perf_counter() - t0
    assert status == 200 and int(headers["Content-Length"]) == len(body)
    return took, body.decode()


def value(text: str, name: str, **labels: str) -> float:
    return find(text, name, **labels)[0].value


def test_a_60_s_nvml_hang(tmp_path):
    node = Exporter(
        "-c",
        "500",
        "--collect-timeout",
        "1000",
        fleet=FIXTURES / "hang.yaml",
        log=tmp_path / "exporter.log",
    )
    try:
        node.wait_ready()
        threads_before = node.threads()

        def stuck() -> bool:
            return b"busy reading GPU 2" in node.get("/ready")[2]

        wait_until(stuck, 15, "the worker to hang on GPU 2")
        hang_seen = time.monotonic()
        _, text = scrape(node)
        frozen = value(text, "gpu_exporter_last_collection_success_timestamp_seconds")
        skipped0 = value(text, "gpu_exporter_collections_total", result="skipped")

        latencies, threads, rss = [], set(), []
        ready_503 = 0
        while time.monotonic() < hang_seen + HANG_S - 5:
            took, text = scrape(node)
            latencies.append(took)
            # stale, and saying so: the success time stands still, skipped cycles count up
            assert value(text, "gpu_exporter_last_collection_success_timestamp_seconds") == frozen
            assert {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_POWER_USAGE")} == {
                "0",
                "1",
                "2",
                "3",
            }  # the last values of every GPU stay served
            status, _, body = node.get("/ready")
            if status == 503:
                ready_503 += 1
                assert b"busy reading GPU 2" in body
            threads.add(node.threads())
            rss.append(node.rss_mib())
            time.sleep(0.1)
        skipped = value(text, "gpu_exporter_collections_total", result="skipped") - skipped0
        assert skipped >= (HANG_S - 10) / 0.5 * 0.8  # one skipped cycle per interval
        assert ready_503 >= len(latencies) * 0.9
        assert threads == {threads_before}, (threads_before, threads)  # nothing piles up
        latencies.sort()
        p99 = latencies[int(len(latencies) * 0.99)]
        assert p99 < 0.05, latencies[-5:]

        # the call returns: collection resumes at the next cycle, GPU 2 set aside for 60 s
        def fresh() -> str | None:
            text = scrape(node)[1]
            ok = value(text, "gpu_exporter_last_collection_success_timestamp_seconds") > frozen
            return text if ok else None

        text = wait_until(fresh, 15, "a fresh collection after the hang")
        up = {s.labels["gpu"]: s.value for s in find(text, "gpu_exporter_gpu_up")}
        assert up == {"0": 1, "1": 1, "2": 0, "3": 1}
        assert {s.labels["gpu"] for s in find(text, "DCGM_FI_DEV_POWER_USAGE")} == {"0", "1", "3"}
        wait_until(lambda: node.get("/ready")[0] == 200, 5, "ready again")
        assert b"GPU 2" in node.get("/ready")[2] and b"set aside" in node.get("/ready")[2]
        assert node.threads() == threads_before
    finally:
        log = node.stop()
    # said when found and once a minute after, not once per interval
    assert 1 <= log.count("serving the last snapshot") <= 3, log[-2000:]
    # the call began one collect timeout before the first warning; fresh data came back
    # with the first cycle after it returned
    began = logged_at(log, "collection exceeded") - 1.0
    back = logged_at(log, "collection cycles finish again")
    assert 0 <= back - (began + HANG_S) <= 0.5 + 0.2
    print(
        f"\nhang: {len(latencies)} scrapes during it, latency median "
        f"{statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max "
        f"{latencies[-1] * 1000:.1f} ms; threads {threads_before} throughout; RSS "
        f"{min(rss):.1f}-{max(rss):.1f} MiB; fresh data {back - began - HANG_S:.2f} s after "
        "the call returned"
    )


def logged_at(log: str, needle: str) -> float:
    """Unix time of the first log line containing ``needle``."""
    line = next(x for x in log.splitlines() if needle in x)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
