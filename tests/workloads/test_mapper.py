"""Device-to-pod map from a real gRPC kubelet on a unix socket (the fake kubelet)."""

from __future__ import annotations

import pytest

from exporter.frame import Owner
from exporter.workloads.kubelet.podresources import PodResourcesClient
from exporter.workloads.mapper import Mapper


@pytest.fixture
async def mapper(kubelet):
    m = Mapper(PodResourcesClient(str(kubelet.socket_path), timeout_s=0.5))
    yield m
    await m.client.close()


async def test_every_allocation_form(mapper, kubelet, inventory):
    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    o = mapper.map.owners
    assert mapper.status == ""
    assert o[gpus[0].key] == (Owner("ml", "train-0", "trainer"),)
    assert o[gpus[2].key] == o[gpus[3].key] == (Owner("serving", "infer-2", "server"),)
    assert o[gpus[4].key] == (Owner("ml", "gke-job", "main"),)
    assert o[gpus[1].key] == (
        Owner("batch", "batch-a", "worker"),
        Owner("batch", "batch-b", "worker"),
        Owner("batch", "batch-c", "worker"),
    )
    assert len(o[gpus[5].key]) == 2
    assert mapper.map.shared == {gpus[1].key, gpus[5].key}
    assert o[migs[(6, 7)].key] == (Owner("research", "mig-small-0", "notebook"),)
    assert o[migs[(6, 8)].key] == (Owner("research", "mig-small-1", "notebook"),)
    assert o[migs[(7, 2)].key] == (Owner("research", "mig-large", "trainer"),)
    assert o[migs[(7, 7)].key] == (Owner("research", "mig-gke", "job"),)
    assert gpus[6].key not in o and gpus[7].key not in o  # MIG parents are never owned
    assert dict(mapper.unmatched) == {"nvidia.com/gpu": 1}


async def test_extra_resource_names(kubelet, inventory):
    gpus, migs = inventory
    m = Mapper(PodResourcesClient(str(kubelet.socket_path)), ["example.com/*"])
    await m.refresh(gpus.values(), migs.values())
    assert m.unmatched["example.com/fpga"] == 1  # read, and reported as matching no GPU
    await m.client.close()


async def test_kubelet_restart_and_backoff(mapper, kubelet, inventory):
    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    before = mapper.map
    kubelet.stop(remove_socket=False)
    await mapper.refresh(gpus.values(), migs.values())
    assert "kubelet" in mapper.status and mapper.map is before  # last good map kept
    kubelet.start()
    mapper._retry_at = 0  # skip the backoff wait
    await mapper.refresh(gpus.values(), migs.values())
    assert mapper.status == "" and mapper.map.owners == before.owners


async def test_socket_missing_runs_without_labels(mapper, kubelet, inventory):
    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    kubelet.stop()  # removes the socket
    await mapper.refresh(gpus.values(), migs.values())
    assert "does not exist" in mapper.status
    assert mapper.map.owners  # a restarting kubelet: labels kept for a grace period
    mapper._last_ok -= 31
    await mapper.refresh(gpus.values(), migs.values())
    assert not mapper.map.owners


@pytest.mark.parametrize(
    ("mode", "needle", "min_backoff"),
    [
        ("exhausted", "RESOURCE_EXHAUSTED", 5.0),
        ("malformed", "not a valid", 1.0),
        ("slow", "DEADLINE_EXCEEDED", 1.0),
    ],
)
async def test_bad_answers_back_off(mapper, kubelet, inventory, mode, needle, min_backoff):
    gpus, migs = inventory
    kubelet.mode, kubelet.delay = mode, 2.0
    import time

    now = time.monotonic()
    await mapper.refresh(gpus.values(), migs.values())
    assert needle in mapper.status
    assert mapper._retry_at - now >= min_backoff * 0.9
    calls = kubelet.calls
    await mapper.refresh(gpus.values(), migs.values())  # inside the backoff: no call
    assert kubelet.calls == calls


async def test_unchanged_answer_reuses_the_map(mapper, kubelet, inventory):
    """The same answer for the same devices keeps the map (and its counts per refresh);
    a new pod, or a device gone, rebuilds it."""
    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    first = mapper.map
    await mapper.refresh(gpus.values(), migs.values())
    assert mapper.map is first and mapper.rebuilds == 1 and mapper.refreshes == 2
    assert dict(mapper.unmatched) == {"nvidia.com/gpu": 2}  # counted each refresh, as built

    pod = kubelet.pods.pod_resources.add(name="late", namespace="ml")
    pod.containers.add(name="c").devices.add(
        resource_name="nvidia.com/gpu", device_ids=[gpus[7].uuid]
    )
    await mapper.refresh(gpus.values(), migs.values())
    assert mapper.rebuilds == 2 and mapper.map.owners[gpus[7].key] == (Owner("ml", "late", "c"),)

    await mapper.refresh([g for i, g in gpus.items() if i != 7], migs.values())
    assert mapper.rebuilds == 3 and gpus[7].key not in mapper.map.owners


async def test_a_rate_limited_kubelet_keeps_the_last_map_and_backs_off(mapper, kubelet, inventory):
    """The kubelet's rate limiter (100 calls/s, burst 10) answers RESOURCE_EXHAUSTED: the
    pods stay labelled from the last good answer and the mapper waits at least 5 s."""
    import time

    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    good = mapper.map
    assert good.owners
    kubelet.mode = "exhausted"
    now = time.monotonic()
    await mapper.refresh(gpus.values(), migs.values())
    assert "RESOURCE_EXHAUSTED" in mapper.status
    assert mapper.map is good
    assert mapper._retry_at - now >= 5.0 * 0.9
    calls = kubelet.calls
    for _ in range(5):  # the cycles inside the backoff do not ask
        await mapper.refresh(gpus.values(), migs.values())
    assert kubelet.calls == calls and mapper.map is good
    kubelet.mode = "ok"
    mapper._retry_at = 0.0  # the backoff is over
    await mapper.refresh(gpus.values(), migs.values())
    assert mapper.status == "" and mapper.map.owners == good.owners


async def test_answers_are_decoded_and_mapped_off_the_event_loop(
    mapper, kubelet, inventory, monkeypatch
):
    """A new answer is decoded and mapped in the mapper's worker thread (the event loop
    keeps serving scrapes meanwhile); an unchanged one is recognised without it."""
    import threading

    from exporter.workloads import mapper as module

    threads: list[str] = []
    real_parse = module.parse

    def parse(raw: bytes):  # the real decoding, noting where it runs
        threads.append(threading.current_thread().name)
        return real_parse(raw)

    monkeypatch.setattr(module, "parse", parse)
    gpus, migs = inventory
    await mapper.refresh(gpus.values(), migs.values())
    await mapper.refresh(gpus.values(), migs.values())
    assert mapper.status == "" and mapper.map.owners
    assert len(threads) == 1 and threads[0].startswith("kube-map")
    assert threading.current_thread() is threading.main_thread()
