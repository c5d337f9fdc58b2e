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
from exporter.config.model import Config, KubeConfig, default_metrics_file
from exporter.poller import Poller
from exporter.sim.fleet import FLEETS_DIR
from exporter.sim.kubelet import response as answer
from exporter.workloads.attribution import STALE_S
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from tests.procs import ROOT, require
from tests.support.exposition import Sample, samples
from tests.support.fakekubelet import FakeKubelet

FLEET = FLEETS_DIR / "accounting.yaml"
STEP = 2.0  # collection interval, sim seconds
AWAY = (700.0, 730.0)  # the kubelet is away from ... to (sim s; cycles fall on both)
# The last answer before it goes is at 698: the map is charged for STALE_S (10 s) more,
# to the cycle at 708; from the cycle at 710 to its return at 730 holders are unknown.
UNKNOWN_S = 20.0
DOWN = (800.0, 810.0)  # the exporter restarts: its last cycle at 800, the new one's first at 810
DOWN_S = DOWN[1] - DOWN[0]
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
UNKNOWN = "gpu_exporter_attribution_unknown_gpu_seconds_total"
UNKNOWN_ENERGY = "gpu_exporter_attribution_unknown_energy_joules_total"
DOWN_FAMILY = "gpu_exporter_down_gpu_seconds_total"
DOWN_ENERGY = "gpu_exporter_down_energy_joules_total"
REPLICAS = "gpu_exporter_accounting_share_replicas"
ACTIVITY_ENERGY = "gpu_exporter_activity_energy_joules_total"
ACTIVITY_REST = "gpu_exporter_unattributed_activity_energy_joules_total"
IDLE_POWER = "gpu_exporter_idle_power_watts"
BASIS = "gpu_exporter_activity_basis"


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


class Exporter:
    """One exporter process's parts: the collector, attribution and poller (publish step),
    keeping the accounting state in ``state_dir``."""

    def __init__(self, clock, kubelet, state_dir: Path) -> None:
        from exporter.workloads.attribution import Attribution

        self.attribution = Attribution(KubeConfig("sim-acct-node", str(kubelet.socket_path)))
        catalog = load(default_metrics_file())
        self.collector = Collector(
            catalog,
            "sim-acct-node",
            clock=lambda: EPOCH + clock(),
            wants_processes=self.attribution.wants_processes,
        )
        cfg = Config(accounting_state_dir=str(state_dir))
        self.poller = Poller(catalog, self.collector, STEP, 10.0, self.attribution, cfg)

    async def cycle(self) -> list[Sample]:
        snap = self.collector.collect()
        await self.attribution.refresh(snap)
        self.poller.publish(snap)
        return samples(self.poller.builder.accounting_part.decode())

    async def stop(self) -> None:
        """What SIGTERM does: the state written once more, then everything closed."""
        self.poller.derive.save()
        await self.attribution.close()
        self.collector.close()
        self.poller.close()


async def _cycles(driver, clock, kubelet, state_dir: Path) -> Run:
    run = Run()
    exporter = Exporter(clock, kubelet, state_dir)
    while clock() <= END:
        if clock() == AWAY[0]:
            kubelet.stop()  # its socket goes with it
        elif clock() == AWAY[1]:
            kubelet.start()
        kubelet.pods = answer(driver.pods())
        run.cycles.append((clock(), await exporter.cycle()))
        if clock() == DOWN[0]:  # restarted: a new process, DOWN_S later
            await exporter.stop()
            clock.advance(DOWN[1] - DOWN[0])
            exporter = Exporter(clock, kubelet, state_dir)
            continue
        clock.advance(STEP)
    await exporter.stop()
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("accounting")
    clock = sim.ManualClock()
    driver = sim.install(FLEET, clock=clock, latency=False)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(sim.uninstall)
        kubelet = FakeKubelet(work / "kubelet.sock", answer(driver.pods()))
        kubelet.allocatable = advertised(driver)
        kubelet.start()
        cleanup.callback(kubelet.close)
        start = clock()
        result = asyncio.run(_cycles(driver, clock, kubelet, work / "state"))
        last = result.cycles[-1][0]
        result.energy_j = {
            g.index: (g.energy_mj(last) - g.energy_mj(start)) / 1000 for g in driver.gpus
        }
        yield result


def advertised(driver) -> pb.AllocatableResourcesResponse:
    """What the device plugin advertises: GPU 1 time-sliced into four replicas (its pods
    hold at most three at once), the other GPUs and the MIG instances whole."""
    ids = [g.uuid for g in driver.gpus if g.index != 1 and not g.migs]
    ids += [m.uuid for g in driver.gpus for m in g.migs]
    ids += [f"{driver.gpus[1].uuid}::{r}" for r in range(4)]
    return pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)]
    )


def _close(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * abs(want)


def test_allocated_plus_unallocated_is_elapsed_time_per_gpu(run: Run) -> None:
    elapsed = run.cycles[-1][0] - run.cycles[0][0]
    assert elapsed == pytest.approx(END)
    for gpu in range(6):
        held = run.total(ALLOCATED, gpu=str(gpu))
        free = run.total(UNALLOCATED, gpu=str(gpu))
        unknown = run.total(UNKNOWN, gpu=str(gpu))
        down = run.total(DOWN_FAMILY, gpu=str(gpu))
        assert down == pytest.approx(DOWN_S, abs=1e-3), gpu
        assert _close(held + free + unknown + down, elapsed), (gpu, held, free, unknown, elapsed)
    # GPU 4 is never held; GPU 0 always is (but while the kubelet or the exporter was away)
    assert run.total(ALLOCATED, gpu="4") == 0
    assert _close(run.total(UNALLOCATED, gpu="4"), END - UNKNOWN_S - DOWN_S)
    assert _close(run.total(ALLOCATED, gpu="0", pod="train"), END - UNKNOWN_S - DOWN_S)


def test_counters_carry_on_across_a_restart(run: Run) -> None:
    """The new process restores what the old one wrote at SIGTERM: no series goes down,
    and the 10 s it was not running are down time, not lost, nor anyone's."""
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for t, got in run.cycles:
        for s in got:
            if s.name.endswith("_total"):
                key = (s.name, tuple(sorted(s.labels.items())))
                assert s.value >= last.get(key, 0.0), (t, key)
                last[key] = s.value
    restarted = next(got for t, got in run.cycles if t == DOWN[1])
    train = [s for s in restarted if s.name == ALLOCATED and s.labels.get("pod") == "train"]
    assert train and _close(train[0].value, DOWN[0] - UNKNOWN_S)


def test_while_the_kubelet_is_away_time_and_energy_go_to_attribution_unknown(run: Run) -> None:
    """Every device's part of its GPU, held or not, for the time past the staleness bound:
    a MIG GPU's instances (3 x 1g + 3g = 6/7), whole GPUs all of it."""
    assert STALE_S == 10.0
    for gpu in range(6):
        part = 6 / 7 if gpu == 3 else 1.0
        got = run.final(UNKNOWN)
        (key,) = [k for k in got if dict(k)["gpu"] == str(gpu)]
        assert dict(key)["reason"] == "kubelet_socket_missing"
        assert got[key] == pytest.approx(UNKNOWN_S * part, abs=1e-3), gpu  # as served
        joules = run.total(UNKNOWN_ENERGY, gpu=str(gpu))
        assert 0 < joules < run.energy_j[gpu] * UNKNOWN_S / END * 1.5, gpu


def test_unaccounted_memory_stays_while_the_kubelet_is_away(run: Run) -> None:
    """GPU 4's process outside any pod: its series is served every cycle, the outage
    included, so that GPUMemoryUnaccounted's ``for:`` does not start over."""
    served = [
        t
        for t, got in run.cycles
        if any(s.name == UNACCOUNTED and s.labels["gpu"] == "4" for s in got)
    ]
    assert served[0] <= 200.3 + 2 * STEP and served[-1] == run.cycles[-1][0]
    # all but a new process's first cycle (it reads processes from its second on)
    expected = [t for t, _ in run.cycles if t >= served[0] and t != DOWN[1]]
    assert served == expected


def test_energy_of_holders_plus_unattributed_is_the_gpus_energy(run: Run) -> None:
    for gpu, joules in run.energy_j.items():
        charged = sum(
            run.total(name, gpu=str(gpu))
            for name in (ENERGY, UNATTRIBUTED, UNKNOWN_ENERGY, DOWN_ENERGY)
        )
        assert joules > 0 and _close(charged, joules), (gpu, charged, joules)
    # an unallocated GPU's idle power is unattributed, not lost
    assert run.total(ENERGY, gpu="4") == 0 and run.total(UNATTRIBUTED, gpu="4") > 0


def test_energy_by_activity_also_adds_up_to_the_gpus_energy(run: Run) -> None:
    for gpu, joules in run.energy_j.items():
        charged = sum(
            run.total(name, gpu=str(gpu))
            for name in (ACTIVITY_ENERGY, ACTIVITY_REST, UNKNOWN_ENERGY, DOWN_ENERGY)
        )
        assert _close(charged, joules), (gpu, charged, joules)
    # a whole GPU's sole holder takes all of it, by allocation and by activity alike
    assert _close(run.total(ACTIVITY_ENERGY, pod="train"), run.total(ENERGY, pod="train"))


def test_an_idle_mig_pod_pays_its_slice_of_idle_power_and_none_above_it(run: Run) -> None:
    """The 1g.10gb pod that runs nothing: by allocation it pays a seventh of the GPU's
    energy; by activity a seventh of the GPU's idle power and nothing of the power above
    it. The MIG GPU is never idle, so its idle power is that of its idle sibling of the
    same model (GPU 2): the model's 70 W (models.yaml)."""
    idle_w = run.total(IDLE_POWER, gpu="3")
    assert idle_w == pytest.approx(70.0, rel=1e-3)
    held = run.total(ALLOCATED, pod="idle-mig")
    assert _close(held, (END - 20.5 - UNKNOWN_S - DOWN_S) / 7), held
    got = run.total(ACTIVITY_ENERGY, pod="idle-mig")
    assert _close(got, idle_w * held), (got, idle_w * held)
    assert got < run.total(ENERGY, pod="idle-mig")
    # the instance's GPM activity, as the whole GPUs' (the simulated H100s have GPM)
    assert run.total(BASIS, gpu="3", gpu_i_id="8", basis="gpm") == 1
    assert run.total(BASIS, gpu="0", basis="gpm") == 1
    # the busy 1g.10gb pod pays its slice of idle power and a part of the power above it
    small = run.total(ACTIVITY_ENERGY, pod="small")
    assert small > run.total(ENERGY, pod="small") > idle_w * run.total(ALLOCATED, pod="small")


def test_the_idle_power_is_measured_on_an_idle_gpu(run: Run) -> None:
    """GPU 2 runs nothing: its lowest interval power is the model's idle power."""
    assert run.total(IDLE_POWER, gpu="2") == pytest.approx(70.0, rel=1e-3)  # models.yaml


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
    assert _close(run.total(BUSY, pod="train"), 0.8 * (END - UNKNOWN_S - DOWN_S))
    assert run.total(IDLE, pod="train") == 0
    for key, busy in run.final(BUSY).items():
        assert busy <= run.final(ALLOCATED)[key] + 1e-6, key


def test_a_time_sliced_gpu_is_shared_as_the_device_plugin_advertises_it(run: Run) -> None:
    """Four replicas advertised: each holder of one gets a quarter of the GPU whoever else
    holds the rest, and what no one holds is unallocated (truth from the schedule)."""
    known = END - UNKNOWN_S - DOWN_S  # the kubelet or the exporter away: no one's
    assert _close(run.total(ALLOCATED, pod="ts-a"), known / 4)  # alone from 250.5 to 300.25
    assert _close(run.total(ALLOCATED, pod="ts-b"), 250.5 / 4)
    assert _close(run.total(ALLOCATED, pod="ts-c"), (known - 300.25) / 4)
    free = known - (known + 250.5 + known - 300.25) / 4
    assert _close(run.total(UNALLOCATED, gpu="1"), free)
    assert run.total(REPLICAS, gpu="1", basis="advertised") == 4


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
