"""workloads/attribution.py against a real gRPC kubelet on a unix socket (the fake kubelet):
how long its last answer is charged for once it stops answering, what is trusted
meanwhile, and which devices get a holder of their own."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

import pytest

from exporter.config.model import KubeConfig
from exporter.nvml.devices import Device
from exporter.nvml.processes import ProcUse
from exporter.snapshot import Snapshot
from exporter.workloads.advertised import SOONEST_S
from exporter.workloads.attribution import STALE_S, Attribution
from tests.workloads.test_advertised import plugin

T0 = 1.8e9  # the collector's unix seconds at the first cycle
FB_USED = "DCGM_FI_DEV_FB_USED"
# a GPU no pod holds, with memory in use and a process on it
LOOSE = Device("LOOSE", 9, "GPU-loose", "NVIDIA H100 80GB HBM3", None, (("UUID", "GPU-loose"),))


@pytest.fixture
def snap(inventory) -> Snapshot:
    gpus, migs = inventory
    return Snapshot(
        T0,
        0.0,
        gpus=tuple(gpus.values()),
        entities=(*gpus.values(), *migs.values(), LOOSE),
        values=MappingProxyType({"LOOSE": MappingProxyType({FB_USED: 512.0})}),
        processes=MappingProxyType({"LOOSE": (ProcUse(4242, 512.0, 1.0),)}),
    )


@pytest.fixture
async def attribution(kubelet):
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))
    yield attr
    await attr.close()


async def test_the_last_answer_is_charged_for_stale_s_then_attribution_is_unknown(
    attribution, kubelet, snap
):
    """The kubelet answers at T0, then refuses (RESOURCE_EXHAUSTED): its answer stays
    good up to and including STALE_S later, not a moment past it; once it answers again,
    the STALE_S start over from then."""
    assert STALE_S == 10.0
    await attribution.refresh(snap)
    assert attribution.unknown(T0) == ""
    kubelet.mode = "exhausted"
    await attribution.refresh(snap)
    assert attribution.mapper.status  # not answering
    assert [attribution.unknown(T0 + dt) for dt in (2.0, STALE_S)] == ["", ""]
    assert attribution.unknown(T0 + STALE_S + 0.5) == "kubelet_throttled"
    assert attribution.unknown(T0 + 60.0) == "kubelet_throttled"
    kubelet.mode = "ok"
    attribution.mapper._retry_at = 0.0  # past its backoff
    await attribution.refresh(snap)
    assert attribution.unknown(T0 + 100.0) == ""
    kubelet.mode = "exhausted"
    attribution.mapper._retry_at = 0.0
    await attribution.refresh(snap)
    assert attribution.unknown(T0 + 100.0 + STALE_S) == ""
    assert attribution.unknown(T0 + 100.0 + STALE_S + 0.5) == "kubelet_throttled"


async def test_a_kubelet_never_reached_is_given_stale_s_from_the_first_cycle(tmp_path, snap):
    attr = Attribution(KubeConfig("n", str(tmp_path / "none.sock"), timeout_s=2))
    try:
        await attr.refresh(snap)
        assert attr.unknown(T0) == "" and attr.unknown(T0 + STALE_S) == ""
        assert attr.unknown(T0 + STALE_S + 1.0) == "kubelet_socket_missing"
    finally:
        await attr.close()


async def test_while_the_kubelet_does_not_answer_no_process_is_unaccounted(
    attribution, kubelet, snap
):
    """A GPU missing from a map that is not current says nothing about who holds it: its
    processes are neither read nor counted unaccounted until the kubelet answers."""
    kubelet.mode = "exhausted"
    await attribution.refresh(snap)
    used = {FB_USED: 512.0}
    assert attribution.wants_processes()("LOOSE", used) is False
    assert attribution.usage(snap)["LOOSE"].unaccounted_processes == 0
    kubelet.mode = "ok"
    attribution.mapper._retry_at = 0.0
    await attribution.refresh(snap)
    assert attribution.wants_processes()("LOOSE", used) is True
    use = attribution.usage(snap)["LOOSE"]
    assert (use.unaccounted_processes, use.unaccounted_bytes) == (1, 512 << 20)


async def test_a_device_one_container_holds_has_its_holder_and_a_shared_one_has_none(
    attribution, snap, inventory
):
    """GPU 0 is train-0's alone; GPU 1 is time-sliced between three pods: it gets no single
    holder (its pod labels would name one of three), nor any sharers without
    --kubernetes-virtual-gpus."""
    gpus, _ = inventory
    await attribution.refresh(snap)
    held = attribution.holders()
    assert (held[gpus[0].key].owner.namespace, held[gpus[0].key].owner.pod) == ("ml", "train-0")
    assert gpus[1].key not in held
    assert attribution.sharers() == {}
    assert attribution.status().kubelet_up


async def test_before_the_first_refresh_no_device_has_a_holder(kubelet):
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))
    try:
        assert attr.holders() == {} and attr.sharers() == {}
        assert attr.duration == 0.0 and attr.details() == ["pod labels off: kubelet not asked yet"]
        assert attr.status().api_up is None  # the API server is not watched: nothing asks for it
    finally:
        await attr.close()


@pytest.mark.parametrize(
    "flag",
    [{"pod_uid": True}, {"pod_labels": "team"}, {"dcgm_pod_labels": True}, {"dra": True}],
    ids=["pod_uid", "pod_labels", "dcgm_pod_labels", "dra"],
)
async def test_each_flag_that_needs_the_api_server_alone_starts_its_watch(
    kubelet, monkeypatch, flag
):
    """--kubernetes-pod-uid, either pod-label flag and DRA need the API server: it is
    watched from the start (its state served as gpu_exporter_kube_api_up), not only once
    a GPU is shared."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2, **flag))
    try:
        assert attr.watcher is not None and attr.status().api_up is not None
    finally:
        await attr.close()


async def test_an_api_server_watch_that_cannot_start_says_why_in_ready(kubelet, caplog):
    attr = Attribution(KubeConfig("", str(kubelet.socket_path), timeout_s=2, pod_uid=True))
    try:
        why = "API server not usable: node name is empty: set NODE_NAME"
        assert attr.details()[1].startswith(why)
        assert attr.status().api_up is False
        assert any(
            r.getMessage().startswith("node name is empty")
            and r.getMessage().endswith("; pod UIDs, labels, DRA and shared-GPU splits are off")
            for r in caplog.records
        )
    finally:
        await attr.close()


class _BrokenWatcher:
    """An API-server watcher whose pod lookups fail (a bug there, say)."""

    status = ""
    pods_synced = False
    drops = None

    def pod_by_name(self, namespace: str, name: str):
        raise RuntimeError("lookup failed")

    def slice_device(self, driver: str, pool: str, name: str):
        return None

    def stop(self) -> None:
        pass


async def test_a_refresh_that_fails_is_counted_and_charged_as_mapping_failed(kubelet, snap, caplog):
    """A failure inside attribution keeps the cycle going: it is counted (the
    mapping-failures self-metric), shown in /ready, and past STALE_S the time goes to
    attribution unknown with reason mapping_failed."""
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2), _BrokenWatcher())
    try:
        assert attr.unknown(T0) == ""  # the first call starts the clock
        await attr.refresh(snap)
        await attr.refresh(snap)
        assert attr.status().mapping_failures == 2
        assert attr.details()[0] == "pod labels off: kube mapping failed: RuntimeError"
        assert attr.unknown(T0 + STALE_S + 1.0) == "mapping_failed"
        assert 0 < attr.duration < 5.0  # seconds the refresh took
        mine = "exporter.workloads.attribution"
        logged = {r.getMessage() for r in caplog.records if r.name == mine}
        want = "kube mapping failed: RuntimeError: lookup failed; keeping the last pod labels"
        assert logged == {want}
    finally:
        await attr.close()


async def test_a_map_build_that_hangs_is_given_up_at_the_kubelet_timeout_plus_1_s(kubelet, snap):
    """timeout_s 1: the refresh waits 2 s in all, then charges kubelet_timeout; a build
    that takes 2.5 s (a huge answer, a slow node) is not waited for."""
    import time

    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=1))
    try:
        assert attr.unknown(T0) == ""
        await attr.refresh(snap)
        assert attr.mapper.status == ""  # answered within the 2 s
        build = attr.mapper._map_for

        def slow(*args):
            time.sleep(2.5)
            return build(*args)

        attr.mapper._map_for = slow  # type: ignore[method-assign]
        kubelet.pods = type(kubelet.pods)()  # a new answer: the map is built again
        await attr.refresh(snap)
        assert attr.mapper.status == "kubelet did not answer in time"
        assert attr.details()[0] == "pod labels off: kubelet did not answer in time"
        assert attr.unknown(T0 + STALE_S + 1.0) == "kubelet_timeout"
    finally:
        await attr.close()


async def test_a_time_sliced_gpu_is_shared_over_the_replicas_the_plugin_advertises(
    attribution, kubelet, snap, inventory
):
    """GPU 1: four replicas held by three pods; the device plugin advertises eight, so
    the holders' shares are over eight (basis "advertised"), half of it held."""
    gpus, _ = inventory
    kubelet.allocatable = plugin(gpus[1].uuid, 8)
    await attribution.refresh(snap)
    use = attribution.usage(snap)[gpus[1].key]
    assert (use.replicas, use.basis) == (8, "advertised")
    assert sum(c.share for c in use.claims) == 0.5


async def test_with_virtual_gpus_each_holder_of_a_shared_gpu_is_listed(kubelet, snap, inventory):
    gpus, _ = inventory
    cfg = KubeConfig("n", str(kubelet.socket_path), timeout_s=2, virtual_gpus=True)
    attr = Attribution(cfg)
    try:
        await attr.refresh(snap)
        sharers = attr.sharers()[gpus[1].key]
        assert sorted(h.owner.pod for h in sharers) == ["batch-a", "batch-b", "batch-c"]
        assert sorted(h.vgpu for h in sharers) == ["0", "1", "2,3"]
    finally:
        await attr.close()


async def test_holders_follow_the_kubelet_without_an_api_server(kubelet, snap, inventory):
    """A node with no shared GPU watches no API server: the holders still follow each
    answer (train-0 leaves: GPU 0 has none), and held GPUs' processes are not read (no
    join to pods is possible)."""
    gpus, _ = inventory
    only = type(kubelet.pods)()
    only.pod_resources.extend(p for p in kubelet.pods.pod_resources if p.name == "train-0")
    kubelet.pods = only
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))
    try:
        await attr.refresh(snap)
        assert attr.watcher is None and attr.joinable is False
        assert attr.holders()[gpus[0].key].owner.pod == "train-0"
        assert attr.wants_processes()(gpus[0].key, {FB_USED: 100.0}) is False
        kubelet.pods = type(kubelet.pods)()
        await attr.refresh(snap)
        assert attr.holders() == {}
    finally:
        await attr.close()


async def test_a_get_allocatable_resources_that_hangs_is_given_up_at_the_timeout_plus_1_s(
    kubelet, snap, inventory
):
    """timeout_s 1: List answers, GetAllocatableResources never does (a client past its
    own deadline): the cycle's refresh gives it up after 2 s in all, the pod labels stay
    on, and the time-sliced GPU's shares are over the replicas held. It is asked again
    EVERY_S later, not SOONEST_S (as after an answer that lacks a held replica)."""
    gpus, _ = inventory
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=1))
    asked = []

    async def hang() -> bytes:
        asked.append(1)
        await asyncio.sleep(60)
        return b""

    attr.client.allocatable_bytes = hang  # type: ignore[method-assign]
    try:
        await attr.refresh(snap)
        assert 2.0 <= attr.duration < 2.8  # seconds
        assert not attr.mapper.status and attr.holders()[gpus[0].key].owner.pod == "train-0"
        use = attr.usage(snap)[gpus[1].key]
        assert (use.replicas, use.basis) == (4, "held")
        attr.advertised._asked_at -= SOONEST_S  # as if SOONEST_S had passed
        await attr.refresh(snap)
        assert len(asked) == 1
    finally:
        await attr.close()


async def test_the_kubelet_asked_between_cycles_dates_a_holders_end(
    kubelet, snap, inventory, caplog
):
    """Before the first cycle nothing is asked (nor logged); after it, an answer between
    cycles that no longer lists train-0 ends its hold midway between the two answers."""
    gpus, _ = inventory
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))
    try:
        await attr.sight(T0 - 5.0)
        assert kubelet.calls == 0 and caplog.records == []
        await attr.refresh(snap)
        attr.windows()  # the holders the first answer listed: no start known
        left = type(kubelet.pods)()
        left.pod_resources.extend(p for p in kubelet.pods.pod_resources if p.name != "train-0")
        kubelet.pods = left
        await attr.sight(T0 + 5.0)
        gone = attr.windows()[(gpus[0].key, "ml", "train-0", "trainer")]
        assert (gone.start, gone.end, gone.share) == (None, T0 + 2.5, 1.0)
    finally:
        await attr.close()


async def test_a_failing_ask_between_cycles_is_logged(kubelet, snap, caplog):
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))

    async def broken(*args: object) -> None:
        raise RuntimeError("boom")

    try:
        await attr.refresh(snap)
        attr.mapper.refresh = broken  # type: ignore[method-assign]
        await attr.sight(T0 + 5.0)
        logged = [r.getMessage() for r in caplog.records if r.name == attr.__module__]
        assert logged == ["kubelet asked between cycles: RuntimeError: boom"]
    finally:
        await attr.close()


async def test_the_advertised_replicas_are_asked_when_due_not_every_cycle(
    attribution, kubelet, snap
):
    """Two cycles a moment apart: List each cycle, GetAllocatableResources only in the
    first (the kubelet rate-limits its pod-resources calls)."""
    await attribution.refresh(snap)
    assert kubelet.calls == 2  # List, GetAllocatableResources
    await attribution.refresh(snap)
    assert kubelet.calls == 3  # List
