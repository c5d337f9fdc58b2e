"""--container-labels against a Docker-API stub on a real unix socket: which container holds
which GPU (device requests, NVIDIA_VISIBLE_DEVICES), the answers' bounds, the cache of
one interval, the last answer kept on failure, and the copies with ``container``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Config, default_metrics_file
from exporter.poller import Poller
from exporter.workloads import containers
from exporter.workloads.containers import Holding, Runtime, by_device, container_name, holding
from tests.support.exposition import find

CATALOG = load(default_metrics_file())


def inspect(name: str, requests: Any = None, env: Any = None) -> dict[str, Any]:
    return {"Name": name, "HostConfig": {"DeviceRequests": requests}, "Config": {"Env": env}}


GPU = [["gpu"]]


@pytest.mark.parametrize(
    ("answer", "refs"),
    [
        (inspect("/t", [{"Driver": "nvidia", "DeviceIDs": ["0", "GPU-ab"]}]), ("0", "GPU-ab")),
        (inspect("/a", [{"Driver": "", "Count": -1, "Capabilities": GPU}]), ("all",)),
        (inspect("/a", [{"Count": 2, "Capabilities": [["compute", "gpu"]]}]), ("0", "1")),
        (inspect("/a", None, ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1,MIG-GPU-x/2/0"]),
         ("1", "MIG-GPU-x/2/0")),
        (inspect("/a", None, ["NVIDIA_VISIBLE_DEVICES=all"]), ("all",)),
        # a device request wins over the environment
        (inspect("/a", [{"Driver": "nvidia", "DeviceIDs": ["3"]}], ["NVIDIA_VISIBLE_DEVICES=all"]),
         ("3",)),
    ],
)  # fmt: skip
def test_what_a_container_holds(answer, refs):
    got = holding(answer)
    assert got is not None and got.refs == refs and got.name == answer["Name"][1:]


@pytest.mark.parametrize(
    "answer",
    [
        inspect("/web"),
        inspect("/a", None, ["NVIDIA_VISIBLE_DEVICES=none"]),
        inspect("/a", None, ["NVIDIA_VISIBLE_DEVICES=void"]),
        inspect("/a", [{"Driver": "other", "Count": -1}]),
        {"Id": "no name"},
    ],
)
def test_containers_without_gpus(answer):
    assert holding(answer) is None


def test_container_names_are_sanitized():
    assert container_name("/job\n1\x00") == "job_1_"
    assert len(container_name("/" + "é" * 200).encode()) <= 128


def test_devices_a_container_names(node_devices):
    gpus, insts = node_devices
    mig = insts[0]
    held = [
        Holding("all", ("all",)),
        Holding("by-index", ("0",)),
        Holding("by-uuid", (gpus[1].key,)),
        Holding("by-mig-uuid", (mig.key,)),
        Holding("old-mig", (f"MIG-GPU-{mig.uuid[4:]}/{mig.gi}/{mig.ci}",)),
        Holding("nothing", ("GPU-none", "17")),
    ]
    got = by_device(held, gpus + insts)
    assert got[gpus[0].key] == ("all", "by-index")
    assert got[gpus[1].key] == ("all", "by-uuid")
    assert got[mig.key] == ("all", "by-mig-uuid", "old-mig")
    # a container holding a MIG GPU holds its instances (their series are the GPU's under -d f)
    parent = mig.parent
    assert parent is not None and got[parent.key] == ("all",)
    assert "nothing" not in {n for names in got.values() for n in names}


@pytest.fixture
def node_devices():
    sim.install(None, latency=False)
    col = Collector(CATALOG, "n")
    try:
        snap = col.collect()
        yield list(snap.gpus), [e for e in snap.entities if e.is_mig]
    finally:
        col.close(0.5)
        sim.uninstall()


@dataclass
class Stub:
    """A Docker Engine API stub: what it answers, and what it was asked."""

    running: dict[str, dict[str, Any]] = field(default_factory=dict)  # ID -> inspect answer
    asked: list[str] = field(default_factory=list)
    fail: int = 0  # answer the list with this status (0: 200)
    delay_s: float = 0.0
    huge: bool = False
    inspect_delay_s: float = 0.0
    broken: set[str] = field(default_factory=set)  # IDs whose inspection answers 500
    cancelled: int = 0  # inspections the client gave up on while they were answered
    runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/containers/json", self.list)
        app.router.add_get("/containers/{id}/json", self.inspect)
        return app

    async def list(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(request.path)
        await asyncio.sleep(self.delay_s)
        if self.fail:
            return web.Response(status=self.fail, text="daemon error")
        if self.huge:  # 11 MiB of valid JSON
            return web.Response(text=json.dumps([{"Id": "x" * 64, "Pad": "y" * (11 << 20)}]))
        return web.json_response(
            [{"Id": cid, "Names": [a["Name"]]} for cid, a in self.running.items()]
        )

    async def inspect(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(request.path)
        try:
            await asyncio.sleep(self.inspect_delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if request.match_info["id"] in self.broken:
            return web.Response(status=500, text="inspect failed")
        got = self.running.get(request.match_info["id"])
        return web.json_response(got) if got else web.Response(status=404)


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[tuple[Stub, str]]:
    s = Stub()
    runner = s.runner = web.AppRunner(s.app(), handler_cancellation=True)
    await runner.setup()
    path = str(tmp_path / "docker.sock")
    await web.UnixSite(runner, path).start()
    yield s, path
    await runner.cleanup()


async def test_runtime_lists_inspects_and_caches_one_interval(stub):
    s, path = stub
    s.running = {"c1": inspect("/train", [{"Driver": "nvidia", "DeviceIDs": ["0"]}]),
                 "c2": inspect("/web")}  # fmt: skip
    rt = Runtime(path, interval_s=0.3)
    try:
        await rt.refresh()
        assert rt.up and rt.held == (Holding("train", ("0",)),)
        assert sorted(s.asked) == ["/containers/c1/json", "/containers/c2/json", "/containers/json"]
        await rt.refresh()  # within the interval: the cached answer
        assert len(s.asked) == 3
        s.running["c3"] = inspect("/eval", None, ["NVIDIA_VISIBLE_DEVICES=1"])
        del s.running["c1"]
        await asyncio.sleep(0.35)
        await rt.refresh()  # a container is inspected once for its life: only c3 is asked
        assert s.asked[3:] == ["/containers/json", "/containers/c3/json"]
        assert rt.held == (Holding("eval", ("1",)),)
    finally:
        await rt.close()


@pytest.mark.parametrize("trouble", ["status", "huge", "slow", "gone"])
async def test_the_last_answer_stays_when_the_runtime_fails(stub, trouble, monkeypatch, caplog):
    s, path = stub
    s.running = {"c1": inspect("/train", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])}
    monkeypatch.setattr(containers, "TIMEOUT_S", 0.3)
    rt = Runtime(path, interval_s=0.0)
    try:
        await rt.refresh()
        before = rt.held
        if trouble == "status":
            s.fail = 500
        elif trouble == "huge":
            s.huge = True
        elif trouble == "slow":
            s.delay_s = 1.0
        else:  # the daemon stopped
            assert s.runner is not None
            await s.runner.cleanup()
        await rt.refresh()
        assert not rt.up and rt.held == before
        assert any("keeping the last answer" in r.getMessage() for r in caplog.records)
        if trouble == "huge":
            assert "larger than 2048 KiB" in caplog.text
    finally:
        await rt.close()


async def test_a_slow_runtime_is_cut_at_the_refresh_deadline(stub, monkeypatch):
    """1,024 new containers whose inspections take 2 s each: the refresh ends at its
    deadline with what was inspected, the rest cancelled and asked for next time. The
    deadline (3 s) leaves the first round 1 s to start and the second 1 s to spare."""
    s, path = stub
    s.running = {f"c{i}": inspect(f"/n{i}", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])
                 for i in range(1024)}  # fmt: skip
    s.inspect_delay_s = 2.0
    monkeypatch.setattr(containers, "REFRESH_S", 3.0)
    rt = Runtime(path, interval_s=0.0)
    try:
        t0 = time.monotonic()
        await rt.refresh()
        assert time.monotonic() - t0 < 3.5  # not 1024 / 8 x 2 s = 256 s
        await asyncio.sleep(0.2)  # the server sees the client go away
        assert s.asked.count("/containers/json") == 1
        assert len(s.asked) - 1 == 16  # two rounds of 8 were started, the second cut
        assert s.cancelled == 8 and not rt.up  # the second round, cancelled at the deadline
        assert not [t for t in asyncio.all_tasks() if "_inspect" in repr(t.get_coro())]
        s.inspect_delay_s = 0.0
        await rt.refresh()
        assert rt.up and len(rt.held) == 1024
    finally:
        await rt.close()


async def test_an_inspection_that_always_fails_bounds_the_cache(stub, caplog):
    """One broken container: the others are still held, the cache holds only the listed
    containers, and a container that leaves the list leaves the cache."""
    s, path = stub
    s.running = {f"c{i}": inspect(f"/n{i}", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])
                 for i in range(20)}  # fmt: skip
    s.broken = {"c0"}
    rt = Runtime(path, interval_s=0.0)
    try:
        for gen in range(5):  # the containers come and go; c0 never answers
            s.running = {k: v for k, v in s.running.items() if k[0] == "c" and int(k[1:]) < 10}
            s.running |= {f"g{gen}x{i}": inspect(f"/g{gen}x{i}", None,
                          ["NVIDIA_VISIBLE_DEVICES=all"]) for i in range(10)}  # fmt: skip
            await rt.refresh()
            assert rt.up and len(rt.held) == 19  # 9 of the first ten, and this generation's
            assert set(rt._seen) <= set(s.running) and len(rt._seen) == 19
        assert s.asked.count("/containers/c0/json") == 5  # asked again, once a refresh
        assert "inspections failed" in caplog.text
    finally:
        await rt.close()


async def test_a_refresh_reads_a_bounded_number_of_bytes(stub):
    """100 new containers answering 200 KiB each: a refresh reads at most 16 MiB, the
    containers left are inspected at the next one, and every one ends up held."""
    s, path = stub
    pad = ["PAD=" + "x" * (200 << 10)]
    s.running = {f"c{i}": inspect(f"/n{i}", [{"Driver": "nvidia", "DeviceIDs": ["0"]}], pad)
                 for i in range(100)}  # fmt: skip
    rt = Runtime(path, interval_s=0.0)
    try:
        await rt.refresh()
        first = len(rt.held)
        assert 0 < first < 100 and first * (200 << 10) <= containers.MAX_REFRESH_BYTES
        for _ in range(3):
            await rt.refresh()
        assert len(rt.held) == 100
        assert s.asked.count("/containers/json") == 4
    finally:
        await rt.close()


async def test_answers_are_decoded_off_the_event_loop(stub, monkeypatch):
    s, path = stub
    s.running = {"c1": inspect("/train", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])}
    threads = []
    real = containers.holding

    def spy(answer):
        threads.append(threading.current_thread().name)
        return real(answer)

    monkeypatch.setattr(containers, "holding", spy)
    rt = Runtime(path, interval_s=0.0)
    try:
        await rt.refresh()
        assert rt.held == (Holding("train", ("0",)),)
        assert threads and all(t.startswith("runtime-json") for t in threads)
    finally:
        await rt.close()


async def test_a_slow_runtime_never_delays_the_collection_cycle(stub, monkeypatch):
    """The list takes 3 s: each cycle still finishes in well under a second, with the
    containers of the last answer."""
    s, path = stub
    s.running = {"c1": inspect("/train", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])}
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 0.0, 1.0, cfg=Config(container_socket=path))
    rt = poller.runtime
    assert rt is not None
    try:
        await rt.refresh()
        s.delay_s = 3.0
        for _ in range(3):
            t0 = time.monotonic()
            await poller.cycle()
            assert time.monotonic() - t0 < 1.0
        gpu0 = find(poller.builder.dcgm_text, "DCGM_FI_DEV_POWER_USAGE", gpu="0")
        assert sorted(str(x.labels.get("container")) for x in gpu0) == ["None", "train"]
    finally:
        await rt.close()
        col.close(0.5)
        poller.close()
        sim.uninstall()


async def _one_cycle(socket: str) -> str:
    """The DCGM text of one cycle of the simulated default node with --container-labels."""
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config(container_socket=socket))
    try:
        await poller.runtime.refresh()  # type: ignore[union-attr]
        await poller.cycle()  # its own refresh runs beside it, an interval later
        return poller.builder.dcgm_text
    finally:
        await poller.runtime.close()  # type: ignore[union-attr]
        col.close(0.5)
        poller.close()
        sim.uninstall()


async def test_series_copied_per_container_and_kept_without(stub):
    s, path = stub
    s.running = {
        "c1": inspect("/train", [{"Driver": "nvidia", "DeviceIDs": ["0"]}]),
        "c2": inspect("/eval", None, ["NVIDIA_VISIBLE_DEVICES=0,1"]),
    }
    text = await _one_cycle(path)
    gpu0 = find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="0")
    assert sorted(str(x.labels.get("container")) for x in gpu0) == ["None", "eval", "train"]
    assert len({x.value for x in gpu0}) == 1
    assert [x.labels.get("container") for x in find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="1")] == [
        None,
        "eval",
    ]
    assert [x.labels.get("container") for x in find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="2")] == [
        None
    ]


async def test_a_container_name_utf8_cannot_carry_is_exported_as_u_fffd(stub):
    """A runtime that answers ``"Name": "/tr\\ud800in"`` (JSON's escape of a lone
    surrogate, which no UTF-8 can carry): the copies carry U+FFFD in its place."""
    s, path = stub
    s.running = {"c1": inspect("/tr\ud800in", [{"Driver": "nvidia", "DeviceIDs": ["0"]}])}
    text = await _one_cycle(path)
    gpu0 = find(text, "DCGM_FI_DEV_POWER_USAGE", gpu="0")
    assert sorted(str(x.labels.get("container")) for x in gpu0) == ["None", "tr\ufffdin"]
