"""The ledger at its edges: its defaults and bound as docs/accounting.md gives them, the
order it evicts in, intervals of no time, energy counters that appear, go or stand still,
time while the kubelet is away, and GPUs of different models.

As in test_ledger.py, snapshots are data and what is checked is the exposition's text.
"""

from __future__ import annotations

import logging

import pytest

from exporter.derive.accounting.ledger import Ledger
from exporter.exposition.accounting import AccountText
from exporter.frame import Claim, DeviceUse, Window
from exporter.nvml.devices import Device
from tests.derive.accounting.test_ledger import ENERGY, UTIL, gpu, held, mig, served, snap
from tests.support.exposition import samples

AWAY = "kubelet unreachable"


def pods(ledger: Ledger) -> set[str]:
    """The pods whose series are served."""
    return {who for _, who in served(ledger) if "/" not in who}


def test_the_defaults_are_the_documented_ones() -> None:
    """--accounting-retention 120000 ms and an idle threshold of 1 %: an ended holder is
    served 120 s after it ended and not after; activity under 1 % is idle, 1 % is not."""
    g0, g1 = gpu(0), gpu(1)
    ledger = Ledger()
    uses = {g0.key: held(Claim("ml", "low", "c")), g1.key: held(Claim("ml", "one", "c"))}
    values = {g0.key: {UTIL: 0.9}, g1.key: {UTIL: 1.0}}
    for t in (0, 10):
        ledger.update(snap(t, [g0, g1], values=values), uses)
    got = served(ledger)
    assert got[("idle_gpu_seconds_total", "low")] == 10
    assert got[("idle_gpu_seconds_total", "one")] == 0
    ledger.update(snap(20, [g0, g1], values=values), {})  # both ended at 20
    ledger.update(snap(140, [g0, g1], values=values), {})
    assert pods(ledger) == {"low", "one"}
    ledger.update(snap(141, [g0, g1], values=values), {})
    assert pods(ledger) == set()
    assert ledger.dropped["retention"] == 2


def test_past_the_default_bound_of_2048_a_new_holder_is_refused_and_named(caplog) -> None:
    g = gpu()
    ledger = Ledger()
    claims = [Claim("ns", f"p{i}", "c", 1 / 2049) for i in range(2049)]
    with caplog.at_level(logging.WARNING, "exporter.derive.accounting.ledger"):
        ledger.update(snap(0, [g]), {g.key: held(*claims)})
    text, _ = AccountText().families(ledger.accounts(None, ()))
    assert 'gpu_exporter_accounting_holders_dropped_total{reason="limit"} 1\n' in text
    assert text.count("\ngpu_exporter_allocated_gpu_seconds_total{") == 2048
    assert 'pod="p2047"' in text and 'pod="p2048"' not in text
    assert [r.getMessage() for r in caplog.records] == [
        "GPU accounting holds 2048 holders, its bound; holder ns/p2048/c is not counted"
    ]


def test_a_holder_back_in_the_cycle_that_evicts_is_kept_and_the_next_ended_goes() -> None:
    """a ended at 1, x at 2, b at 3; at 4 n1, x and n2 hold in that order: n1 takes a's
    place, x holds again, n2 takes b's (not x's, and it is not refused)."""
    g = gpu()
    ledger = Ledger(retention_s=1000, max_holders=3)
    a, x, b, n1, n2 = (Claim("ns", p, "c", 1 / 3) for p in ("a", "x", "b", "n1", "n2"))
    for t, claims in ((0, (a, x, b)), (1, (x, b)), (2, (b,)), (3, ()), (4, (n1, x, n2))):
        ledger.update(snap(t, [g]), {g.key: held(*claims)} if claims else {})
    assert pods(ledger) == {"n1", "x", "n2"}
    assert ledger.dropped["limit"] == 2


def test_a_holder_ends_whatever_holders_were_seen_before_it() -> None:
    """Of two holders the one seen first stays; the other ends and goes at its retention."""
    g0, g1 = gpu(0), gpu(1)
    ledger = Ledger(retention_s=30)
    both = {g0.key: held(Claim("ml", "stays", "c")), g1.key: held(Claim("ml", "goes", "c"))}
    ledger.update(snap(0, [g0, g1]), both)
    for t in (10, 20, 41, 51):
        ledger.update(snap(t, [g0, g1]), {g0.key: both[g0.key]})
    assert pods(ledger) == {"stays"}
    assert ledger.dropped["retention"] == 1


def test_busy_and_idle_add_up_over_intervals() -> None:
    g0, g1 = gpu(0), gpu(1)
    ledger = Ledger()
    uses = {g0.key: held(Claim("ml", "busy", "c")), g1.key: held(Claim("ml", "idle", "c"))}
    for t in (0, 10, 30):
        ledger.update(snap(t, [g0, g1], values={g0.key: {UTIL: 50}, g1.key: {UTIL: 0}}), uses)
    got = served(ledger)
    assert got[("busy_gpu_seconds_total", "busy")] == 15
    assert got[("idle_gpu_seconds_total", "idle")] == 30
    assert got[("idle_gpu_seconds_total", "busy")] == 0


def test_a_cycle_at_the_time_of_the_last_charges_nothing() -> None:
    """Two snapshots taken at the same time (a clock that did not move): no interval, no
    error; the next interval is charged as usual."""
    g = gpu()
    ledger = Ledger()
    a = {g.key: held(Claim("ml", "a", "c"))}
    for t, mj in ((0, 0), (0, 1_000_000), (10, 2_000_000)):
        ledger.update(snap(t, [g], values={g.key: {ENERGY: mj}}), a)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 10
    assert got[("energy_joules_total", "a")] == 1000


def test_energy_is_charged_only_over_intervals_whose_ends_both_read_the_counter() -> None:
    """The counter is not read at 0 and 30: only 10 to 20 has energy (1,000 J)."""
    g = gpu()
    ledger = Ledger()
    a = {g.key: held(Claim("ml", "a", "c"))}
    for t, mj in ((0, None), (10, 1_000_000), (20, 2_000_000), (30, None), (40, 4_000_000)):
        ledger.update(snap(t, [g], values={g.key: {} if mj is None else {ENERGY: mj}}), a)
    got = served(ledger)
    assert got[("energy_joules_total", "a")] == 1000
    assert got[("allocated_gpu_seconds_total", "a")] == 40


def test_a_counter_that_stood_still_is_an_interval_of_0_w() -> None:
    """The GPU used no energy from 0 to 10 by its counter: nobody is charged any, and its
    lowest interval power is 0 W."""
    g = gpu()
    ledger = Ledger()
    a = {g.key: held(Claim("ml", "a", "c"))}
    for t in (0, 10):
        ledger.update(snap(t, [g], values={g.key: {ENERGY: 5_000_000}}), a)
    got = served(ledger)
    assert got[("energy_joules_total", "a")] == 0
    assert got[("idle_power_watts", "0/")] == 0


def test_while_the_kubelet_is_away_holders_do_not_end_and_time_goes_to_unknown() -> None:
    """Away from 10 to 40, longer than the retention: the holders stay and carry on; the
    whole GPU 0 (its counter not read) is unknown for 30 s and 0 J, MIG GPU 1's 3g
    instance for 3/7 of 30 s and of the 7,000 J the GPU used."""
    g0, g1 = gpu(0), gpu(1)
    m = mig(g1, 1, 3)
    uses = {g0.key: held(Claim("ml", "a", "c")), m.key: held(Claim("ml", "b", "c"))}
    ledger = Ledger(retention_s=15)

    def cycle(t: float, unknown: str = "") -> None:
        values = {g1.key: {ENERGY: t * 100_000}}  # 100 W
        ledger.update(snap(t, [g0, g1], [g0, m], values), {} if unknown else uses, unknown)

    for t in (0, 10):
        cycle(t)
    text, _ = AccountText().families(ledger.accounts(None, ()))
    assert not [s for s in samples(text) if "unknown" in s.name]
    for t in (20, 30, 40):
        cycle(t, AWAY)
    cycle(50)
    got = served(ledger)
    assert pods(ledger) == {"a", "b"}
    assert ledger.dropped["retention"] == 0
    assert got[("allocated_gpu_seconds_total", "a")] == 20  # 0-10 and 40-50
    unknown = {
        (s.name, s.labels["gpu"], s.labels["reason"]): s.value
        for s in samples(AccountText().families(ledger.accounts(None, ()))[0])
        if "unknown" in s.name
    }
    assert unknown == pytest.approx(
        {
            ("gpu_exporter_attribution_unknown_gpu_seconds_total", "0", AWAY): 30,
            ("gpu_exporter_attribution_unknown_energy_joules_total", "0", AWAY): 0,
            ("gpu_exporter_attribution_unknown_gpu_seconds_total", "1", AWAY): 30 * 3 / 7,
            ("gpu_exporter_attribution_unknown_energy_joules_total", "1", AWAY): 3000 * 3 / 7,
        },
        abs=1e-3,
    )


def test_each_model_has_its_own_idle_power() -> None:
    """An H100 drawing 100 W and an A100 drawing 300 W: each GPU's idle power is its own
    model's lowest, not the other's."""
    g0 = gpu(0)
    a100 = "NVIDIA A100-SXM4-80GB"
    labels = tuple((k, a100 if k == "modelName" else v) for k, v in gpu(1).labels)
    g1 = Device("GPU-1", 1, "GPU-1", a100, None, labels)
    ledger = Ledger()
    for t in (0, 10):
        values = {g0.key: {ENERGY: t * 100_000}, g1.key: {ENERGY: t * 300_000}}
        ledger.update(snap(t, [g0, g1], values=values), {})
    got = served(ledger)
    assert got[("idle_power_watts", "0/")] == 100
    assert got[("idle_power_watts", "1/")] == 300


def test_holders_that_ended_or_came_and_went_leave_the_rest_of_the_interval_to_no_one() -> None:
    """GPU 0 (100 W) from 0 to 10: a held half of it until 4, e half of it from 2 to 2.5;
    GPU 1: f held it all until 0.5. What they did not hold is unallocated, and the energy
    of it unattributed."""
    g0, g1 = gpu(0), gpu(1)
    a, e, f = ("GPU-0", "ml", "a", "c"), ("GPU-0", "ml", "e", "c"), ("GPU-1", "ml", "f", "c")
    ledger = Ledger()
    uses = {g0.key: held(Claim("ml", "a", "c", 0.5)), g1.key: held(Claim("ml", "f", "c"))}
    ledger.update(snap(0, [g0, g1], values={g0.key: {ENERGY: 0}}), uses)
    windows = {a: Window(None, 4.0, 0.5), e: Window(2.0, 2.5, 0.5), f: Window(None, 0.5)}
    ledger.update(snap(10, [g0, g1], values={g0.key: {ENERGY: 1_000_000}}), {}, windows=windows)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 2
    assert got[("energy_joules_total", "a")] == 200
    assert got[("allocated_gpu_seconds_total", "e")] == 0.25
    assert got[("energy_joules_total", "e")] == 25
    assert got[("unallocated_gpu_seconds_total", "0/")] == 7.75  # 5 + 3 - 0.25
    assert got[("unattributed_energy_joules_total", "0/")] == 775
    assert got[("allocated_gpu_seconds_total", "f")] == 0.5
    assert got[("unallocated_gpu_seconds_total", "1/")] == 9.5


def test_a_pod_that_came_and_went_is_kept_for_the_retention_from_the_cycle_that_saw_it() -> None:
    g = gpu()
    ledger = Ledger(retention_s=30)
    e = ("GPU-0", "ml", "e", "c")
    for t in (0, 10, 20, 30, 40, 41):
        ledger.update(snap(t, [g]), {}, windows={e: Window(2.0, 6.0)} if t == 10 else None)
        if t == 40:
            assert pods(ledger) == {"e"}
    assert pods(ledger) == set()
    assert ledger.dropped["retention"] == 1


def test_only_devices_held_in_replicas_have_a_share_replicas_series() -> None:
    g0, g1, g2 = gpu(0), gpu(1), gpu(2)
    uses = {
        g0.key: DeviceUse((Claim("ml", "a", "c", 0.5),), replicas=2, basis="advertised"),
        g1.key: held(Claim("ml", "b", "c")),
    }
    text, _ = AccountText().families(Ledger().accounts(uses, [g0, g1, g2]))
    got = [s for s in samples(text) if s.name == "gpu_exporter_accounting_share_replicas"]
    assert [(s.labels["gpu"], s.labels["basis"], s.value) for s in got] == [("0", "advertised", 2)]
