"""Pods shorter than the collection interval are charged the time they held their GPU.

exporter/sim/fleets/accounting.yaml's twelve 10 s pods on GPU 2 (one every 23 s from
411.3 s), collected every 30 s (the default interval) for 15 simulated minutes, with the
kubelet asked every SIGHT_S between cycles as the Poller does: the real collector, pod
attribution over the kubelet's pod-resources socket and publish step. The truth comes
from the fleet's schedule and the simulated driver's own energy counter. With the API
server's container times (a real PodIndex fed the pods as the API server would serve
them: whole seconds), each pod is charged its 10 s to 1 %; without them, by the middle
between the kubelet's answers, each within half a sighting interval.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Config, KubeConfig, default_metrics_file
from exporter.poller import Poller
from exporter.sim.fleet import FLEETS_DIR
from exporter.sim.kubelet import response as answer
from exporter.workloads.apiserver.podindex import LabelPolicy, PodIndex
from exporter.workloads.attribution import Attribution
from exporter.workloads.limits import Drops
from exporter.workloads.sightings import SIGHT_S
from tests.support.exposition import samples
from tests.support.fakekubelet import FakeKubelet

FLEET = FLEETS_DIR / "accounting.yaml"
STEP = 30.0  # the default collection interval
END = 900.0
EPOCH = 1.8e9
ALLOCATED = "gpu_exporter_allocated_gpu_seconds_total"
ENERGY = "gpu_exporter_energy_joules_total"
UNALLOCATED = "gpu_exporter_unallocated_gpu_seconds_total"
UNATTRIBUTED = "gpu_exporter_unattributed_energy_joules_total"


def _stamp(t: float) -> str:
    """Sim time ``t`` as the API server writes a container's time: whole seconds."""
    return datetime.fromtimestamp(EPOCH + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(spec: Any, t: float) -> dict[str, Any]:
    """The API server's pod object of a fleet pod at sim time ``t``."""
    if spec.end is not None and t >= spec.end:
        state = {"terminated": {"startedAt": _stamp(spec.start), "finishedAt": _stamp(spec.end)}}
    else:
        state = {"running": {"startedAt": _stamp(spec.start)}}
    status = {"name": spec.container, "containerID": f"containerd://{spec.name}", "state": state}
    meta = {"uid": f"uid-{spec.name}", "name": spec.name, "namespace": spec.namespace}
    return {"metadata": meta, "status": {"containerStatuses": [status]}}


class Pods:
    """The API server's view of the node's pods, in the watch's real PodIndex (no process
    join: ``pods_synced`` False, so no host /proc is read)."""

    pods_synced = False
    status = ""

    def __init__(self) -> None:
        self.index = PodIndex(LabelPolicy(), Drops())

    def show(self, specs: Any, t: float) -> None:
        self.index.replace(_pod(s, t) for s in specs if s.start <= t)

    def pod_by_name(self, namespace: str, name: str) -> Any:
        return self.index.pod_by_name(namespace, name)

    def pod(self, uid: str) -> Any:
        return self.index.pod(uid)

    def slice_device(self, *_: str) -> None:
        return None

    def stop(self) -> None:
        pass


async def _run(driver, clock, kubelet, api: Pods | None) -> dict[str, dict[tuple, float]]:
    """Cycles every STEP with the kubelet asked every SIGHT_S between them; the final value
    of each accounting series."""
    watcher = api
    attribution = Attribution(KubeConfig("sim-acct-node", str(kubelet.socket_path)), watcher)
    catalog = load(default_metrics_file())
    collector = Collector(
        catalog,
        "sim-acct-node",
        clock=lambda: EPOCH + clock(),
        wants_processes=attribution.wants_processes,
    )
    poller = Poller(catalog, collector, STEP, 10.0, attribution, Config())
    final: dict[str, dict[tuple, float]] = {}
    try:
        while clock() <= END:
            kubelet.pods = answer(driver.pods())
            if api is not None:
                api.show(driver.fleet.pods, clock())
            if clock() % STEP == 0:
                snap = collector.collect()
                await attribution.refresh(snap)
                poller.publish(snap)
                for s in samples(poller.builder.accounting_part.decode()):
                    final.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
            else:
                await attribution.sight(EPOCH + clock())
            clock.advance(SIGHT_S)
    finally:
        await attribution.close()
        collector.close()
        poller.close()
    return final


def _total(final: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return sum(
        v
        for key, v in final.get(name, {}).items()
        if all(dict(key).get(k) == want for k, want in labels.items())
    )


@pytest.fixture(scope="module", params=["api", "kubelet"])
def run(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    clock = sim.ManualClock()
    driver = sim.install(FLEET, clock=clock, latency=False)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(sim.uninstall)
        sock = tmp_path_factory.mktemp("short") / "kubelet.sock"
        kubelet = FakeKubelet(sock, answer(driver.pods()))
        kubelet.start()
        cleanup.callback(kubelet.close)
        api = Pods() if request.param == "api" else None
        final = asyncio.run(_run(driver, clock, kubelet, api))
        yield request.param, driver, final


def _short(driver) -> list[Any]:
    return [p for p in driver.fleet.pods if p.name.startswith("short-")]


def test_each_10_s_pod_at_a_30_s_interval_is_charged_its_10_s(run) -> None:
    """With the API server's times each within 1 % (whole seconds of a 10 s pod); from the
    kubelet's answers alone each within half a sighting interval, 1 % in total."""
    basis, driver, final = run
    pods = _short(driver)
    assert len(pods) == 12
    got = {p.name: _total(final, ALLOCATED, pod=p.name) for p in pods}
    truth = {p.name: p.end - p.start for p in pods}
    bound = 0.01 * 10 if basis == "api" else SIGHT_S / 2
    for name, want in truth.items():
        assert abs(got[name] - want) <= bound, (basis, name, got[name], want)
    assert abs(sum(got.values()) - sum(truth.values())) <= 0.01 * sum(truth.values()), got


def test_each_short_pod_is_charged_its_gpus_energy_while_it_ran(run) -> None:
    """Truth: the simulated driver's energy counter over the pod's life."""
    basis, driver, final = run
    gpu = driver.gpus[2]
    rel = 0.01 if basis == "api" else SIGHT_S / 2 / 10
    total = want_total = 0.0
    for p in _short(driver):
        want = (gpu.energy_mj(p.end) - gpu.energy_mj(p.start)) / 1000
        got = _total(final, ENERGY, pod=p.name)
        assert abs(got - want) <= rel * want, (basis, p.name, got, want)
        total, want_total = total + got, want_total + want
    assert abs(total - want_total) <= 0.01 * want_total


def test_gpu_2_still_adds_up(run) -> None:
    """Allocated + unallocated = elapsed, and holders' + unattributed energy = the GPU's."""
    _, driver, final = run
    held = _total(final, ALLOCATED, gpu="2")
    free = _total(final, UNALLOCATED, gpu="2")
    assert held + free == pytest.approx(END, rel=1e-6)
    gpu = driver.gpus[2]
    joules = (gpu.energy_mj(END) - gpu.energy_mj(0.0)) / 1000
    charged = _total(final, ENERGY, gpu="2") + _total(final, UNATTRIBUTED, gpu="2")
    assert charged == pytest.approx(joules, rel=1e-3)
