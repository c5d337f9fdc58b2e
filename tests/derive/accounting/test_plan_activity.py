"""derive/accounting/plan.py's activity and parts, through the ledger as a scrape reads it:
what each device's activity is measured by, how the energy above idle power follows it,
and how holders' measured SM use splits a shared GPU.

GPU 0 of each test draws 100 W and is held by nobody (its energy is no holder's): as the
same model, it sets the idle power of every GPU (docs/accounting.md, energy by activity),
so a GPU drawing 400 W over the 100 s interval has 10,000 J of idle power (split by
allocation) and 30,000 J above it (split by activity).
"""

from __future__ import annotations

import pytest

from exporter.derive.accounting.ledger import Ledger
from exporter.exposition.accounting import AccountText
from exporter.frame import Claim, DeviceUse, Window
from exporter.nvml.devices import Device
from tests.derive.accounting.test_ledger import ENERGY, SM, UTIL, gpu, held, mig, served, snap
from tests.support.exposition import samples

IDLE_J, ABOVE_J = 10_000.0, 30_000.0  # of a GPU at 400 W over 100 s, with GPU 0 at 100 W


def _run(gpus, entities, values, uses) -> Ledger:
    """Two cycles 100 s apart with the same readings; GPU 0 at 100 W, the others at 400 W."""
    ledger = Ledger()
    for t in (0, 100):
        watts = {g.key: {ENERGY: t * (100_000 if g.index == 0 else 400_000)} for g in gpus}
        merged = {k: {**watts.get(k, {}), **values.get(k, {})} for k in {*watts, *values}}
        ledger.update(snap(t, gpus, entities, merged), uses)
    return ledger


def _by_activity(ledger: Ledger) -> dict[str, float]:
    """Each holder's energy by activity (J), and each GPU's that no holder got ("gpu N")."""
    got = served(ledger)
    out = {who: v for (name, who), v in got.items() if name == "activity_energy_joules_total"}
    for (name, who), v in got.items():
        if name == "unattributed_activity_energy_joules_total":
            out[f"gpu {who.split('/')[0]}"] = v
    return out


def test_each_device_names_what_its_activity_was_measured_by() -> None:
    """GPM SM activity, utilization without GPM, nothing on a MIG instance without GPM
    (not idle for it: it is not known), and a shared GPU's processes' SM use."""
    g0, g1, g2, g3, g4 = (gpu(i) for i in range(5))
    m = mig(g3, 1, 3)
    uses = {
        g1.key: held(Claim("a", "gpm", "c")),
        g2.key: held(Claim("a", "util", "c")),
        m.key: held(Claim("a", "alloc", "c")),
        g4.key: held(
            Claim("a", "p", "c", 0.5, sm_percent=10), Claim("a", "q", "c", 0.5, sm_percent=10)
        ),
    }
    values = {g1.key: {SM: 0.5}, g2.key: {UTIL: 50}, g4.key: {UTIL: 20}}
    ledger = _run([g0, g1, g2, g3, g4], [g0, g1, g2, m, g4], values, uses)
    text, _ = AccountText().families(ledger.accounts(uses, ()))
    bases = {
        (s.labels["gpu"], s.labels.get("gpu_i_id", ""), s.labels["basis"])
        for s in samples(text)
        if s.name == "gpu_exporter_activity_basis"
    }
    assert bases == {
        ("1", "", "gpm"),
        ("2", "", "utilization"),
        ("3", "1", "allocation"),
        ("4", "", "processes"),
    }
    got = served(ledger)
    assert got[("idle_gpu_seconds_total", "alloc")] == 0
    assert got[("busy_gpu_seconds_total", "alloc")] == 0
    activity = _by_activity(ledger)
    assert activity["gpu 1"] == pytest.approx(0, abs=1e-6)  # all of it gpm's
    # nothing measured on GPU 3: its instance's 3 slices of 7 get 3/7 of all of it
    assert activity["alloc"] == pytest.approx((IDLE_J + ABOVE_J) * 3 / 7)


def test_energy_above_idle_follows_the_processes_sm_use_on_a_shared_gpu() -> None:
    """a's processes use 30 % of the SMs (60 % of its half), b's are not known, 10 % is no
    holder's: a gets 0.3 / 0.4 of the 30,000 J above idle, b none; each half the idle."""
    g0, g1 = gpu(0), gpu(1)
    use = DeviceUse(
        (Claim("ml", "a", "c", 0.5, sm_percent=30), Claim("ml", "b", "c", 0.5)),
        unattributed_sm_percent=10,
    )
    ledger = _run([g0, g1], None, {g1.key: {UTIL: 60}}, {g1.key: use})
    assert _by_activity(ledger) == pytest.approx(
        {
            "a": IDLE_J / 2 + ABOVE_J * 0.75,
            "b": IDLE_J / 2,
            "gpu 1": ABOVE_J * 0.25,
            "gpu 0": 10_000,
        },
        abs=1e-3,
    )


def test_energy_above_idle_on_a_mig_gpu_counts_the_unheld_instances_activity() -> None:
    """A held 3g instance at 20 % SM activity and an unheld 2g one at 80 %: the held one
    gets 3/7 of the idle power and (3/7 * 0.2) / (3/7 * 0.2 + 2/7 * 0.8) of the rest."""
    g0, g1 = gpu(0), gpu(1)
    mine, other = mig(g1, 1, 3), mig(g1, 2, 2)
    values = {mine.key: {SM: 0.2}, other.key: {SM: 0.8}}
    ledger = _run([g0, g1], [g0, mine, other], values, {mine.key: held(Claim("ml", "a", "c"))})
    share = (3 / 7 * 0.2) / (3 / 7 * 0.2 + 2 / 7 * 0.8)
    assert _by_activity(ledger)["a"] == pytest.approx(IDLE_J * 3 / 7 + ABOVE_J * share)


def test_an_instance_whose_gpus_slice_count_is_not_known_stays_unallocated() -> None:
    g = gpu(0)
    m = Device(f"MIG-{g.uuid}-1", 0, g.uuid, g.model, None, g.labels, g, 1, 0, "3g.40gb", 3, 0)
    ledger = Ledger()
    for t in (0, 100):
        ledger.update(snap(t, [g], [m]), {m.key: held(Claim("ml", "a", "c"))})
    got = served(ledger)
    assert got[("unallocated_gpu_seconds_total", "0/")] == 100
    assert ("allocated_gpu_seconds_total", "a") not in got


def test_holders_past_the_advertised_replicas_never_get_more_than_the_gpus_energy() -> None:
    """Three holders of half a GPU each (a replica the device plugin no longer advertises):
    their SM use splits all of its energy, not one and a half times it."""
    g0, g1 = gpu(0), gpu(1)
    use = held(*(Claim("ml", p, "c", 0.5, sm_percent=20) for p in ("a", "b", "c")))
    got = served(_run([g0, g1], None, {}, {g1.key: use}))
    parts = [got[("energy_joules_total", p)] for p in ("a", "b", "c")]
    assert parts == pytest.approx([40_000 / 3] * 3)
    assert got[("unattributed_energy_joules_total", "1/")] == pytest.approx(0, abs=1e-3)


def test_busy_never_exceeds_allocated_when_processes_use_more_than_their_share() -> None:
    """a holds half of the GPU and its processes use 80 % of its SMs: busy is all of its
    half, not more; a claim of no part of it (a DRA claim consuming nothing) is charged no
    time."""
    g0, g1 = gpu(0), gpu(1)
    use = held(
        Claim("ml", "a", "c", 0.5, sm_percent=80),
        Claim("ml", "b", "c", 0.5, sm_percent=5),
        Claim("ml", "none", "c", 0.0, sm_percent=5),
    )
    got = served(_run([g0, g1], None, {g1.key: {UTIL: 90}}, {g1.key: use}))
    assert got[("busy_gpu_seconds_total", "a")] == 50
    assert got[("allocated_gpu_seconds_total", "a")] == 50
    assert got[("busy_gpu_seconds_total", "b")] == 5  # 5 % of the GPU: 10 % of its half
    assert got[("allocated_gpu_seconds_total", "none")] == 0


def test_a_shared_gpu_whose_processes_use_under_1_percent_splits_energy_by_them() -> None:
    g0, g1 = gpu(0), gpu(1)
    use = held(
        Claim("ml", "a", "c", 0.5, sm_percent=0.3), Claim("ml", "b", "c", 0.5, sm_percent=0.2)
    )
    got = served(_run([g0, g1], None, {}, {g1.key: use}))
    assert got[("energy_joules_total", "a")] == pytest.approx(40_000 * 0.6)
    assert got[("energy_joules_total", "b")] == pytest.approx(40_000 * 0.4)


def test_a_pod_that_came_and_went_is_charged_its_share_for_its_window() -> None:
    """Between the cycles at 0 and 100, on GPU 1 (50 % utilized by no holder), p held half
    of it from 20 to 60, and q, past the replicas advertised (a share of 1.5), all of it
    from 30 to 50: 20 GPU-seconds each, neither busy nor idle (nothing of theirs was
    measured); p's energy by activity is half the idle power for its 40 s, none above."""
    g0, g1 = gpu(0), gpu(1)
    p, q = ("GPU-1", "ml", "p", "c"), ("GPU-1", "ml", "q", "c")
    ledger = Ledger()
    for t in (0, 100):
        values = {g0.key: {ENERGY: t * 100_000}, g1.key: {ENERGY: t * 400_000, UTIL: 50}}
        windows = {p: Window(20.0, 60.0, 0.5), q: Window(30.0, 50.0, 1.5)} if t else None
        ledger.update(snap(t, [g0, g1], values=values), {}, windows=windows)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "p")] == 20
    assert got[("allocated_gpu_seconds_total", "q")] == 20
    assert got[("busy_gpu_seconds_total", "p")] == 0
    assert got[("idle_gpu_seconds_total", "p")] == 0
    assert got[("activity_energy_joules_total", "p")] == pytest.approx(IDLE_J / 2 * 0.4)
