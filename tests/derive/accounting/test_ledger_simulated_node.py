"""GPU accounting on a simulated node over 15 simulated minutes: the numbers add up.

exporter/sim/fleets/accounting.yaml: whole GPUs, a time-sliced GPU whose holders change,
a MIG GPU, an idle pod, a process outside any pod on an unallocated GPU and a process
that outlives its pod, with pods starting and stopping between cycles. The real
collector, pod attribution (the kubelet's pod-resources API over a unix socket, its
answer following the fleet's pods at each sim time) and publish step run a cycle every
2 simulated seconds (a ManualClock: no real sleeping). What the exporter serves is
checked against independent sources: elapsed time from the clock, each GPU's energy
from the simulated driver's own counter, a MIG instance's share from its profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import KubeConfig, default_metrics_file
from exporter.poller import Poller
from exporter.sim.fleet import FLEETS_DIR
from tests.procs import ROOT, require
from tests.support.exposition import Sample, samples
from tests.support.fakekubelet import FakeKubelet, answer

FLEET = FLEETS_DIR / "accounting.yaml"
STEP = 2.0  # collection interval, sim seconds
END = 900.0  # sim seconds of the run
EPOCH = 1.8e9
SCRAPE_EVERY = 15  # cycles between the samples given to promtool (30 s)
MIB = 1 << 20
ALLOCATED = "gpu_exporter_allocated_gpu_seconds_total"
IDLE = "gpu_exporter_idle_gpu_seconds_total"
BUSY = "gpu_exporter_busy_gpu_seconds_total"
ENERGY = "gpu_exporter_energy_joules_total"
UNALLOCATED = "gpu_exporter_unallocated_gpu_seconds_total"
UNATTRIBUTED = "gpu_exporter_unattributed_energy_joules_total"
UNACCOUNTED = "gpu_exporter_unaccounted_memory_bytes"
UNACCOUNTED_PROCS = "gpu_exporter_unaccounted_processes"


@dataclass
class Run:
    """What the exporter served each cycle, and the simulated driver's own energy."""

    cycles: list[tuple[float, list[Sample]]] = field(default_factory=list)
    energy_j: dict[int, float] = field(default_factory=dict)  # GPU index -> joules in the run

    def final(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Each series' last value (a holder's final value survives its retention)."""
        out = {}
        for _, got in self.cycles:
            for s in got:
                if s.name == name:
                    out[tuple(sorted(s.labels.items()))] = s.value
        return out

    def total(self, name: str, **labels: str) -> float:
        return sum(
            v
            for key, v in self.final(name).items()
            if all(dict(key).get(k) == want for k, want in labels.items())
        )

    def first(self, name: str, **labels: str) -> tuple[float, Sample] | None:
        """When a series matching ``labels`` was first served with a value above 0."""
        for t, got in self.cycles:
            for s in got:
                wanted = all(s.labels.get(k) == v for k, v in labels.items())
                if s.name == name and s.value > 0 and wanted:
                    return t, s
        return None


async def _cycles(driver, clock, kubelet, collector, attribution, poller) -> Run:
    run = Run()
    while clock() <= END:
        kubelet.pods = answer(driver.pods())
        snap = collector.collect()
        await attribution.refresh(snap)
        poller.publish(snap)
        run.cycles.append((clock(), samples(poller.builder.accounting_part.decode())))
        clock.advance(STEP)
    await attribution.close()
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from exporter.workloads.attribution import Attribution

    work = tmp_path_factory.mktemp("accounting")
    clock = sim.ManualClock()
    driver = sim.install(FLEET, clock=clock, latency=False)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(sim.uninstall)
        kubelet = FakeKubelet(work / "kubelet.sock", answer(driver.pods()))
        kubelet.start()
        cleanup.callback(kubelet.close)
        attribution = Attribution(KubeConfig("sim-acct-node", str(kubelet.socket_path)))
        catalog = load(default_metrics_file())
        collector = Collector(
            catalog,
            "sim-acct-node",
            clock=lambda: EPOCH + clock(),
            wants_processes=attribution.wants_processes,
        )
        cleanup.callback(collector.close)
        poller = Poller(catalog, collector, STEP, 10.0, attribution)
        cleanup.callback(poller.close)
        start = clock()
        result = asyncio.run(_cycles(driver, clock, kubelet, collector, attribution, poller))
        last = result.cycles[-1][0]
        result.energy_j = {
            g.index: (g.energy_mj(last) - g.energy_mj(start)) / 1000 for g in driver.gpus
        }
        yield result


def _close(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * abs(want)


def test_allocated_plus_unallocated_is_elapsed_time_per_gpu(run: Run) -> None:
    elapsed = run.cycles[-1][0] - run.cycles[0][0]
    assert elapsed == pytest.approx(END)
    for gpu in range(6):
        held = run.total(ALLOCATED, gpu=str(gpu))
        free = run.total(UNALLOCATED, gpu=str(gpu))
        assert _close(held + free, elapsed), (gpu, held, free, elapsed)
    # GPU 4 is never held; GPU 0 always is
    assert run.total(ALLOCATED, gpu="4") == 0 and _close(run.total(UNALLOCATED, gpu="4"), END)
    assert _close(run.total(ALLOCATED, gpu="0", pod="train"), END)


def test_energy_of_holders_plus_unattributed_is_the_gpus_energy(run: Run) -> None:
    for gpu, joules in run.energy_j.items():
        charged = run.total(ENERGY, gpu=str(gpu)) + run.total(UNATTRIBUTED, gpu=str(gpu))
        assert joules > 0 and _close(charged, joules), (gpu, charged, joules)
    # an unallocated GPU's idle power is unattributed, not lost
    assert run.total(ENERGY, gpu="4") == 0 and run.total(UNATTRIBUTED, gpu="4") > 0


def test_a_1g_10gb_instance_held_600_s_accrues_600_over_7(run: Run) -> None:
    """The H100's GPU instance profiles give 7 compute slices; 1g.10gb has one."""
    got = run.total(ALLOCATED, pod="small", gpu_i_profile="1g.10gb")
    assert _close(got, 600 / 7), got
    large = run.total(ALLOCATED, pod="large", gpu_i_profile="3g.40gb")
    assert _close(large, 400 * 3 / 7), large


def test_a_pod_idle_its_whole_life_is_idle_for_all_it_held(run: Run) -> None:
    held = run.total(ALLOCATED, pod="sleeper")
    assert abs(held - (400.7 - 30.3)) <= STEP  # one interval at most per start and stop
    assert run.total(IDLE, pod="sleeper") == held
    assert run.total(BUSY, pod="sleeper") == 0


def test_busy_follows_utilization_and_never_exceeds_allocated(run: Run) -> None:
    assert _close(run.total(BUSY, pod="train"), 0.8 * END)
    assert run.total(IDLE, pod="train") == 0
    for key, busy in run.final(BUSY).items():
        assert busy <= run.final(ALLOCATED)[key] + 1e-6, key


def test_a_time_sliced_gpu_is_split_among_its_changing_holders(run: Run) -> None:
    """Without per-replica totals from the kubelet, each holder gets 1/holders."""
    a = 250.5 / 2 + (300.25 - 250.5) + (END - 300.25) / 2
    assert _close(run.total(ALLOCATED, pod="ts-a"), a)
    assert _close(run.total(ALLOCATED, pod="ts-b"), 250.5 / 2)
    assert _close(run.total(ALLOCATED, pod="ts-c"), (END - 300.25) / 2)
    assert run.total(UNALLOCATED, gpu="1") < STEP


def test_a_process_that_outlives_its_pod_is_unaccounted_within_two_cycles(run: Run) -> None:
    assert run.first(UNACCOUNTED, gpu="5", allocated="true") is None
    t, s = run.first(UNACCOUNTED, gpu="5") or (None, None)
    assert t is not None and 150.4 < t <= 150.4 + 2 * STEP, t
    assert s.value == 20480 * MIB and s.labels["allocated"] == "false"


def test_a_process_on_an_unallocated_gpu_is_unaccounted_within_two_cycles(run: Run) -> None:
    t, s = run.first(UNACCOUNTED, gpu="4") or (None, None)
    assert t is not None and 200.3 < t <= 200.3 + 2 * STEP, t
    assert s.value == 8192 * MIB and s.labels["allocated"] == "false"
    t, s = run.first(UNACCOUNTED_PROCS, gpu="4") or (None, None)
    assert s is not None and s.value == 1
    # held GPUs whose processes are their holders' show nothing
    for gpu in ("0", "1", "2", "3"):
        assert run.first(UNACCOUNTED, gpu=gpu) is None, gpu


def _promtool_case(run: Run) -> dict:
    """A promtool unit test whose input series are what a 30 s scrape of the run saw."""
    series: dict[tuple[tuple[str, str], ...], list[str]] = {}
    scrapes = run.cycles[::SCRAPE_EVERY]
    for i, (_, got) in enumerate(scrapes):
        for s in got:
            if s.name in (UNACCOUNTED, UNACCOUNTED_PROCS):
                labels = {"__name__": s.name, "job": "gpu-exporter", "instance": "n:9400"}
                labels |= {"node": "sim-acct-node", **s.labels}
                key = tuple(sorted(labels.items()))
                series.setdefault(key, ["_"] * len(scrapes))[i] = repr(s.value)
    inputs = [
        {
            "series": "{" + ", ".join(f'{k}="{v}"' for k, v in key) + "}",
            "values": " ".join(values),
        }
        for key, values in series.items()
    ]
    firing = 'count by (alertname, gpu) (ALERTS{alertstate="firing"})'
    return {
        "rule_files": [str(ROOT / "alerts" / "gpu-accounting.rules.yaml")],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": inputs,
                "promql_expr_test": [
                    {"expr": firing, "eval_time": "4m", "exp_samples": []},
                    {
                        "expr": firing,
                        "eval_time": "14m",
                        "exp_samples": [
                            {"labels": f'{{alertname="{a}", gpu="{g}"}}', "value": 1}
                            for a in ("GPUMemoryUnaccounted", "GPUUsedOutsidePods")
                            for g in ("4", "5")
                        ],
                    },
                ],
            }
        ],
    }


def test_the_alerts_fire_on_what_the_exporter_served(run: Run, tmp_path: Path) -> None:
    """promtool evaluates the shipped rules over the run's unaccounted series."""
    promtool = require("promtool", "prometheus")
    case = tmp_path / "accounting-sim.test.yaml"
    case.write_text(yaml.safe_dump(_promtool_case(run)))
    result = subprocess.run(
        [promtool, "test", "rules", str(case)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
