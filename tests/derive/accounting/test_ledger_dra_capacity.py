"""GPU accounting of DRA devices shared by consumable capacity (KEP-5075), on a simulated node.

GPU 0 is published with allowMultipleAllocations and sits under three claims in two
namespaces, one of them (lab/small) referenced by two pods; GPU 1 sits under two claims
of which the API server knows only one (its consumption unknown: equal parts). The real
collector, pod attribution (the simulator's kubelet answer over a unix socket, the
ResourceSlice and ResourceClaims through the fake API server's list and watch) and
publish step run a cycle every 2 simulated seconds. Checked against independent sources:
elapsed time from the clock, each GPU's energy from the simulated driver's counter, and
each claim's part from the objects served (consumed memory over the device's memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Config, KubeConfig, default_metrics_file
from exporter.poller import Poller
from exporter.sim.kubelet import response as answer
from exporter.sim.resourceslices import resource_claim, resource_slice
from exporter.workloads.apiserver.apiclient import ApiClient
from exporter.workloads.apiserver.kubeconfig import ClusterConfig
from exporter.workloads.apiserver.watch import PodWatcher
from exporter.workloads.attribution import Attribution
from tests.support.exposition import Sample, samples
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet

NODE = "sim-node"
FLEET = """
hostname: sim-node
gpus:
  - model: NVIDIA H100 80GB HBM3
  - model: NVIDIA H100 80GB HBM3
pods:
  - {name: a, namespace: ml, container: c, devices: ["gpu:0"], claim: big}
  - {name: b, namespace: lab, container: c, devices: ["gpu:0"], claim: small}
  - {name: b2, namespace: lab, container: c, devices: ["gpu:0"], claim: small}
  - {name: d, namespace: ml, container: c, devices: ["gpu:0"], claim: tiny}
  - {name: e, namespace: ml, container: c, devices: ["gpu:1"], claim: known}
  - {name: f, namespace: ml, container: c, devices: ["gpu:1"], claim: unlisted}
"""
# MiB of GPU 0's memory capacity each claim consumes (its capacity: the model's memory)
CONSUMED_MIB = {("ml", "big"): 40960, ("lab", "small"): 20480, ("ml", "tiny"): 4096}
PODS = {"big": ("a",), "small": ("b", "b2"), "tiny": ("d",)}  # accounting's holders: pods
STEP = 2.0
END = 240.0
EPOCH = 1.8e9
ALLOCATED = "gpu_exporter_allocated_gpu_seconds_total"
ENERGY = "gpu_exporter_energy_joules_total"
UNALLOCATED = "gpu_exporter_unallocated_gpu_seconds_total"
UNATTRIBUTED = "gpu_exporter_unattributed_energy_joules_total"
REPLICAS = "gpu_exporter_accounting_share_replicas"


class Run:
    def __init__(self) -> None:
        self.last: list[Sample] = []
        self.elapsed = 0.0
        self.energy_j: dict[int, float] = {}
        self.capacity_mib = 0.0

    def total(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.last
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


def _mib(q: str) -> float:
    assert q.endswith("Mi"), q
    return float(q[:-2])


async def _cycles(clock, driver, kubelet, attribution: Attribution, state: Path) -> list[Sample]:
    catalog = load(default_metrics_file())
    collector = Collector(
        catalog, NODE, clock=lambda: EPOCH + clock(), wants_processes=attribution.wants_processes
    )
    poller = Poller(
        catalog, collector, STEP, 10.0, attribution, Config(accounting_state_dir=str(state))
    )
    got: list[Sample] = []
    try:
        while clock() <= END:
            kubelet.pods = answer(driver.pods())
            snap = collector.collect()
            await attribution.refresh(snap)
            poller.publish(snap)
            got = samples(poller.builder.accounting_part.decode())
            clock.advance(STEP)
    finally:
        await attribution.close()
        collector.close()
        poller.close()
    return got


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("capacity")
    (work / "fleet.yaml").write_text(FLEET)
    clock = sim.ManualClock()
    driver = sim.install(work / "fleet.yaml", clock=clock, latency=False)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(sim.uninstall)
        doc = resource_slice(driver.gpus, NODE, "v1", shared=("gpu-0", "gpu-1"))
        claims = [
            resource_claim(name, ns, NODE, "gpu-0", {"memory": f"{mib}Mi"})
            for (ns, name), mib in CONSUMED_MIB.items()
        ]
        claims.append(resource_claim("known", "ml", NODE, "gpu-1", {"memory": "8192Mi"}))
        api = FakeAPIServer(slices=[doc], claims=claims).start()
        cleanup.callback(api.stop)
        kubelet = FakeKubelet(work / "kubelet.sock", answer(driver.pods())).start()
        cleanup.callback(kubelet.close)
        watcher = PodWatcher(NODE, api_client=ApiClient(ClusterConfig(server=api.url)), dra=True)
        watcher.start()
        deadline = time.monotonic() + 10
        while not (watcher.synced and len(watcher.claims) == 4) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watcher.synced, watcher.status
        cfg = KubeConfig(NODE, str(kubelet.socket_path), dra=True)
        attribution = Attribution(cfg, watcher)
        start = clock()
        result = Run()
        result.last = asyncio.run(_cycles(clock, driver, kubelet, attribution, work / "state"))
        end = clock() - STEP
        result.elapsed = end - start
        result.energy_j = {
            g.index: (g.energy_mj(end) - g.energy_mj(start)) / 1000 for g in driver.gpus
        }
        (gpu0,) = [d for d in doc["spec"]["devices"] if d["name"] == "gpu-0"]
        result.capacity_mib = _mib(gpu0["capacity"]["memory"]["value"])
        yield result


def _close(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * abs(want)


def test_each_claim_is_charged_its_consumed_capacity(run: Run) -> None:
    for (ns, claim), mib in CONSUMED_MIB.items():
        part = mib / run.capacity_mib
        seconds = sum(run.total(ALLOCATED, gpu="0", pod=p, namespace=ns) for p in PODS[claim])
        joules = sum(run.total(ENERGY, gpu="0", pod=p, namespace=ns) for p in PODS[claim])
        assert _close(seconds, part * run.elapsed), (claim, seconds, part * run.elapsed)
        assert _close(joules, part * run.energy_j[0]), (claim, joules, part * run.energy_j[0])
    # the pods of one claim share its part evenly
    b = run.total(ALLOCATED, gpu="0", pod="b")
    b2 = run.total(ALLOCATED, gpu="0", pod="b2")
    assert b > 0 and _close(b, b2)


def test_the_claims_and_the_rest_add_up_to_the_device(run: Run) -> None:
    held = run.total(ALLOCATED, gpu="0")
    free = run.total(UNALLOCATED, gpu="0")
    assert _close(held + free, run.elapsed), (held, free, run.elapsed)
    unallocated = 1 - sum(CONSUMED_MIB.values()) / run.capacity_mib
    assert _close(free, unallocated * run.elapsed), (free, unallocated * run.elapsed)
    energy = run.total(ENERGY, gpu="0") + run.total(UNATTRIBUTED, gpu="0")
    assert _close(energy, run.energy_j[0]), (energy, run.energy_j[0])
    assert run.total(REPLICAS, gpu="0", basis="capacity") == 3  # claims, not pods


def test_a_claim_whose_consumption_is_unknown_makes_equal_parts(run: Run) -> None:
    for pod in ("e", "f"):
        seconds = run.total(ALLOCATED, gpu="1", pod=pod)
        assert _close(seconds, run.elapsed / 2), (pod, seconds)
    assert run.total(REPLICAS, gpu="1", basis="even") == 2
    energy = run.total(ENERGY, gpu="1") + run.total(UNATTRIBUTED, gpu="1")
    assert _close(energy, run.energy_j[1])
