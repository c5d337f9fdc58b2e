"""The ledger's rules cycle by cycle: what an interval is charged with, retention of ended
holders and its bound, energy resets, GPUs that go away, shared and MIG GPUs.

Snapshots are written out as data (devices, readings, the kubelet's holders); the
series checked are the exposition's text, as a scrape reads it.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporter.derive.accounting.ledger import Ledger
from exporter.exposition.accounting import AccountText
from exporter.frame import Claim, DeviceUse
from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot
from tests.support.exposition import samples

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM = "DCGM_FI_PROF_SM_ACTIVE"


def gpu(i: int = 0) -> Device:
    labels = (
        ("gpu", str(i)),
        ("UUID", f"GPU-{i}"),
        ("pci_bus_id", f"0000:{i:02x}:00.0"),
        ("device", f"nvidia{i}"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "node"),
        ("DCGM_FI_DRIVER_VERSION", "580.95.05"),
    )
    return Device(f"GPU-{i}", i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", None, labels)


def mig(parent: Device, gi: int, slices: int) -> Device:
    profile = f"{slices}g.{10 * slices}gb"
    labels = (*parent.labels[:5], ("GPU_I_PROFILE", profile), ("GPU_I_ID", str(gi)))
    key = f"MIG-{parent.uuid}-{gi}"
    return Device(
        key,
        parent.index,
        parent.uuid,
        parent.model,
        None,
        labels,
        parent,
        gi,
        0,
        profile,
        slices,
        7,
    )


def snap(t: float, gpus, entities=None, values=None) -> Snapshot:
    vals = {k: MappingProxyType(v) for k, v in (values or {}).items()}
    return Snapshot(
        taken_at=t,
        duration=0.01,
        gpus=tuple(gpus),
        entities=tuple(gpus if entities is None else entities),
        values=MappingProxyType(vals),
    )


def held(*claims: Claim, **kw: float) -> DeviceUse:
    return DeviceUse(tuple(claims), **kw)


def served(ledger: Ledger, uses=None) -> dict:
    """{(family, pod or gpu/gpu_i_id): value} of what the exposition shows."""
    text, _ = AccountText().families(ledger.accounts(uses, ()))
    out = {}
    for s in samples(text):
        who = s.labels.get("pod") or f"{s.labels.get('gpu')}/{s.labels.get('gpu_i_id', '')}"
        out[(s.name.removeprefix("gpu_exporter_"), who)] = s.value
    return out


def test_an_interval_is_charged_with_what_its_start_saw() -> None:
    """A holder first seen is served at 0; the interval that follows is its."""
    g = gpu()
    ledger = Ledger()
    a = {g.key: held(Claim("ml", "a", "c"))}
    b = {g.key: held(Claim("ml", "b", "c"))}
    ledger.update(snap(100, [g], values={g.key: {UTIL: 50, ENERGY: 0}}), a)
    assert served(ledger)[("allocated_gpu_seconds_total", "a")] == 0
    ledger.update(snap(110, [g], values={g.key: {UTIL: 90, ENERGY: 3_000_000}}), b)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 10  # the pod seen at 100
    assert got[("busy_gpu_seconds_total", "a")] == 5  # 50% as seen at 100
    assert got[("energy_joules_total", "a")] == 3000  # mJ -> J, all of the GPU's
    assert got[("allocated_gpu_seconds_total", "b")] == 0


def test_idle_below_the_threshold_or_without_a_process() -> None:
    g0, g1, g2 = gpu(0), gpu(1), gpu(2)
    ledger = Ledger(idle_below=0.01)
    uses = {
        g0.key: held(Claim("a", "low", "c")),  # 0.5 %: idle
        g1.key: held(Claim("a", "busy", "c")),  # 2 %: not idle
        g2.key: held(Claim("a", "nothing", "c", running=False)),  # no process, 30 % (others')
    }
    values = {g0.key: {UTIL: 0.5}, g1.key: {UTIL: 2}, g2.key: {UTIL: 30}}
    for t in (0, 60):
        ledger.update(snap(t, [g0, g1, g2], values=values), uses)
    got = served(ledger)
    assert got[("idle_gpu_seconds_total", "low")] == 60
    assert got[("idle_gpu_seconds_total", "busy")] == 0
    assert got[("idle_gpu_seconds_total", "nothing")] == 60


def test_ended_holders_keep_their_values_for_the_retention_then_go() -> None:
    g = gpu()
    ledger = Ledger(retention_s=30)
    a = {g.key: held(Claim("ml", "a", "c"))}
    ledger.update(snap(0, [g]), a)
    ledger.update(snap(10, [g]), a)
    for t in (20, 30, 40, 50):  # a ended when the cycle at 20 saw no holder
        ledger.update(snap(t, [g]), {})
        if t <= 50:
            assert served(ledger)[("allocated_gpu_seconds_total", "a")] == 20, t
    ledger.update(snap(51, [g]), {})
    assert ("allocated_gpu_seconds_total", "a") not in served(ledger)
    assert ledger.dropped["retention"] == 1
    text, _ = AccountText().families(ledger.accounts(None, ()))
    assert 'gpu_exporter_accounting_holders_dropped_total{reason="retention"} 1' in text


def test_a_holder_back_within_the_retention_carries_on() -> None:
    g = gpu()
    ledger = Ledger(retention_s=30)
    a = {g.key: held(Claim("ml", "a", "c"))}
    for t, uses in ((0, a), (10, a), (20, {}), (30, a), (40, a)):
        ledger.update(snap(t, [g]), uses)
    # 0-10 and 10-20 as a, 20-30 unallocated, 30-40 as a again
    assert served(ledger)[("allocated_gpu_seconds_total", "a")] == 30
    assert served(ledger)[("unallocated_gpu_seconds_total", "0/")] == 10


def test_the_bound_drops_the_longest_ended_first_and_counts_what_it_refuses() -> None:
    gpus = [gpu(i) for i in range(3)]
    ledger = Ledger(retention_s=1000, max_holders=3)
    t = 0.0
    for n in range(5):  # pods p0..p4 hold GPU 0 in turn, one cycle each
        ledger.update(snap(t, gpus), {gpus[0].key: held(Claim("ns", f"p{n}", "c"))})
        t += 1
    assert sorted(k[2] for k in ledger.holders) == ["p2", "p3", "p4"]
    assert ledger.dropped["limit"] == 2
    # three live holders fill the bound: a fourth is not counted, and says so
    live = {g.key: held(Claim("ns", f"live{i}", "c")) for i, g in enumerate(gpus)}
    ledger.update(snap(t, gpus), live)
    shared = held(Claim("ns", "live0", "c"), Claim("ns", "late", "c"))
    ledger.update(snap(t + 1, gpus), {**live, gpus[0].key: shared})
    assert {k[2] for k in ledger.holders} == {"live0", "live1", "live2"}
    assert ledger.dropped["limit"] == 6  # p2, p3, p4 made room; "late" was refused


def test_an_energy_counter_that_went_back_charges_no_energy_that_interval() -> None:
    """A driver reload restarts the GPU's energy counter: that interval's energy is not
    known, so nobody is charged any; GPU-seconds still are."""
    g = gpu()
    ledger = Ledger()
    a = {g.key: held(Claim("ml", "a", "c"))}
    for t, mj in ((0, 9_000_000), (10, 10_000_000), (20, 500_000), (30, 1_500_000)):
        ledger.update(snap(t, [g], values={g.key: {ENERGY: mj}}), a)
    got = served(ledger)
    assert got[("energy_joules_total", "a")] == 2000  # 1000 J + (reset) + 1000 J
    assert got[("allocated_gpu_seconds_total", "a")] == 30
    assert got[("unattributed_energy_joules_total", "0/")] == 0


def test_a_gpu_that_was_away_is_not_charged_for_the_gap() -> None:
    g0, g1 = gpu(0), gpu(1)
    ledger = Ledger(retention_s=1000)
    uses = {g0.key: held(Claim("ml", "a", "c")), g1.key: held(Claim("ml", "b", "c"))}
    ledger.update(snap(0, [g0, g1]), uses)
    ledger.update(snap(10, [g0]), uses)  # GPU 1 lost
    ledger.update(snap(20, [g0]), uses)
    ledger.update(snap(30, [g0, g1]), uses)  # back: starts a new interval
    ledger.update(snap(40, [g0, g1]), uses)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 40
    assert got[("allocated_gpu_seconds_total", "b")] == 10


def test_without_kubernetes_each_device_holds_itself_and_mig_counts_slices() -> None:
    """GPU 0 whole; GPU 1 in MIG mode with a 1g and a 3g instance (3 of 7 slices free)."""
    g0, g1 = gpu(0), gpu(1)
    m1, m3 = mig(g1, 7, 1), mig(g1, 2, 3)
    values = {
        g0.key: {UTIL: 40, ENERGY: 0},
        g1.key: {ENERGY: 0},
        m1.key: {SM: 0.5},
        m3.key: {SM: 0.0},
    }
    ledger = Ledger()
    ledger.update(snap(0, [g0, g1], [g0, m1, m3], values), None)
    values[g0.key] = {UTIL: 40, ENERGY: 70_000_000}
    values[g1.key] = {ENERGY: 70_000_000}
    ledger.update(snap(70, [g0, g1], [g0, m1, m3], values), None)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "0/")] == 70
    assert got[("busy_gpu_seconds_total", "0/")] == 28
    assert got[("allocated_gpu_seconds_total", "1/7")] == 10
    assert got[("busy_gpu_seconds_total", "1/7")] == 5
    assert got[("allocated_gpu_seconds_total", "1/2")] == 30
    assert got[("idle_gpu_seconds_total", "1/2")] == 30
    assert got[("unallocated_gpu_seconds_total", "1/")] == 30
    assert got[("energy_joules_total", "1/7")] == 10_000
    assert got[("unattributed_energy_joules_total", "1/")] == 30_000
    assert got[("unallocated_gpu_seconds_total", "0/")] == 0


def test_a_shared_gpu_splits_energy_by_sm_share_and_busy_by_each_ones_share() -> None:
    """Two holders of one replica each of two; a's processes use 30% of the GPU's SMs,
    b's none, a process no holder owns 10%."""
    g = gpu()
    uses = {
        g.key: held(
            Claim("ml", "a", "c", 0.5, sm_percent=30, running=True),
            Claim("ml", "b", "c", 0.5, sm_percent=0, running=False),
            unattributed_sm_percent=10,
        )
    }
    ledger = Ledger()
    ledger.update(snap(0, [g], values={g.key: {UTIL: 40, ENERGY: 0}}), uses)
    ledger.update(snap(100, [g], values={g.key: {UTIL: 40, ENERGY: 40_000_000}}), uses)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 50
    assert got[("busy_gpu_seconds_total", "a")] == 30  # 30% of the GPU, within its half
    assert got[("idle_gpu_seconds_total", "b")] == 50
    assert got[("energy_joules_total", "a")] == 30_000
    assert got[("energy_joules_total", "b")] == 0
    assert got[("unattributed_energy_joules_total", "0/")] == 10_000
    assert got[("unallocated_gpu_seconds_total", "0/")] == 0


def test_replicas_set_the_shares_of_a_time_sliced_gpu() -> None:
    """Shares are parts of the device: one and three replicas of eight advertised leave
    half of the GPU, and half of its energy, to no one."""
    g = gpu()
    uses = {g.key: held(Claim("b", "one", "c", 1 / 8), Claim("b", "three", "c", 3 / 8))}
    ledger = Ledger()
    ledger.update(snap(0, [g], values={g.key: {ENERGY: 0}}), uses)
    ledger.update(snap(100, [g], values={g.key: {ENERGY: 80_000_000}}), uses)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "one")] == 12.5
    assert got[("allocated_gpu_seconds_total", "three")] == 37.5
    assert got[("unallocated_gpu_seconds_total", "0/")] == 50
    assert got[("energy_joules_total", "one")] == 10_000
    assert got[("unattributed_energy_joules_total", "0/")] == 40_000


def test_holder_series_carry_the_devices_identity_and_the_pod() -> None:
    g = gpu()
    ledger = Ledger()
    ledger.update(snap(0, [g]), {g.key: held(Claim("ml", "a", "c"))})
    (s, *_) = samples(AccountText().families(ledger.accounts(None, ()))[0])
    assert s.labels == {  # our own family: the identity in snake_case
        "gpu": "0",
        "uuid": "GPU-0",
        "model_name": "NVIDIA H100 80GB HBM3",
        "hostname": "node",
        "pod": "a",
        "namespace": "ml",
        "container": "c",
    }


@pytest.mark.parametrize("procs", [0, 2])
def test_unaccounted_series_only_where_there_is_some(procs: int) -> None:
    g = gpu()
    use = DeviceUse((), 2048.0 * procs, procs)
    text, _ = AccountText().families(Ledger().accounts({g.key: use}, [g]))
    got = [s for s in samples(text) if s.name.startswith("gpu_exporter_unaccounted")]
    if not procs:
        assert got == []
        return
    assert {s.name: s.value for s in got} == {
        "gpu_exporter_unaccounted_memory_bytes": 4096,
        "gpu_exporter_unaccounted_processes": 2,
    }
    assert all(s.labels["allocated"] == "false" and s.labels["uuid"] == "GPU-0" for s in got)


def test_holders_past_the_bound_cost_no_walk_over_every_holder() -> None:
    """20,000 live holders at the bound of 2,048: a cycle costs about what one at the bound
    does (when every holder past the bound walked all those kept, 8,192 then: 0.8 s a
    cycle here)."""
    import time

    gpus = [gpu(i) for i in range(8)]

    def best_cycle(per_gpu: int) -> float:
        uses = {g.key: held(*(Claim("ns", f"p{i}-{j}", "c") for j in range(per_gpu)))
                for i, g in enumerate(gpus)}  # fmt: skip
        ledger = Ledger(retention_s=1000)
        times = []
        for t in range(4):
            t0 = time.perf_counter()
            ledger.update(snap(float(t), gpus), uses)
            times.append(time.perf_counter() - t0)
        assert len(ledger.holders) == min(8 * per_gpu, ledger.max_holders)
        return min(times[1:])

    at_bound, past = best_cycle(256), best_cycle(2500)
    assert past < 5 * at_bound + 0.05, (past, at_bound)


def test_a_gpu_gone_for_longer_than_the_retention_is_no_longer_served() -> None:
    """A GPU removed from the node keeps its final values for the retention (the last
    increments get scraped), then its series go."""
    g0, g1 = gpu(0), gpu(1)
    ledger = Ledger(retention_s=30)
    for t in (0, 10):
        ledger.update(snap(t, [g0, g1]), {})
    assert served(ledger)[("unallocated_gpu_seconds_total", "1/")] == 10
    for t in (20, 30, 50):  # GPU 1 gone from the cycle at 20 on
        ledger.update(snap(t, [g0]), {})
        assert served(ledger)[("unallocated_gpu_seconds_total", "1/")] == 10, t
    ledger.update(snap(51, [g0]), {})
    got = served(ledger)
    assert ("unallocated_gpu_seconds_total", "1/") not in got
    assert got[("unallocated_gpu_seconds_total", "0/")] == 51


def test_holders_dropped_at_the_retention_add_up_across_cycles() -> None:
    """a ends at 10, b at 20: each is dropped in its own cycle; the counter is a counter."""
    g = gpu()
    ledger = Ledger(retention_s=30)
    a, b = held(Claim("ml", "a", "c")), held(Claim("ml", "b", "c"))
    for t, uses in ((0, {g.key: a}), (10, {g.key: b}), (20, {}), (41, {}), (51, {})):
        ledger.update(snap(t, [g]), uses)
    text, _ = AccountText().families(ledger.accounts(None, ()))
    assert 'gpu_exporter_accounting_holders_dropped_total{reason="retention"} 2' in text
    assert not any(s.labels.get("pod") for s in samples(text))
