"""derive/accounting/plan.py through the ledger, as a scrape reads it: when a holder's
time is idle, how much is busy when a reading is out of range or not a number, and what
a device one container holds is charged."""

from __future__ import annotations

import math

import pytest

from exporter.derive.accounting.ledger import Ledger
from exporter.exposition.accounting import AccountText
from exporter.frame import Claim, Window
from tests.derive.accounting.test_ledger import ENERGY, SM, UTIL, gpu, held, mig, served, snap
from tests.support.exposition import samples

GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def _run(devices, values, uses, ledger: Ledger | None = None, *, gpus=None) -> dict:
    """Two cycles 100 s apart with the same readings; what is served after the second."""
    ledger = ledger or Ledger()
    gpus = gpus or devices
    for t in (0, 100):
        ledger.update(snap(t, gpus, devices, values), uses)
    return served(ledger, uses)


def test_activity_at_the_idle_threshold_is_not_idle() -> None:
    """--accounting-idle-below 0.01: a GPU at 1 % utilization is busy enough, at 0.99 % idle."""
    g0, g1 = gpu(0), gpu(1)
    uses = {g0.key: held(Claim("a", "at", "c")), g1.key: held(Claim("a", "under", "c"))}
    values = {g0.key: {UTIL: 1}, g1.key: {UTIL: 0.99}}
    got = _run([g0, g1], values, uses, Ledger(idle_below=0.01))
    assert got[("idle_gpu_seconds_total", "at")] == 0
    assert got[("busy_gpu_seconds_total", "at")] == 1
    assert got[("idle_gpu_seconds_total", "under")] == 100


def test_utilization_out_of_range_is_clamped_to_the_held_time() -> None:
    """A reading of 150 % or -5 % (a driver's glitch): busy never exceeds allocated, nor
    goes below 0, and the counters stay counters."""
    g0, g1 = gpu(0), gpu(1)
    uses = {g0.key: held(Claim("a", "over", "c")), g1.key: held(Claim("a", "under", "c"))}
    got = _run([g0, g1], {g0.key: {UTIL: 150}, g1.key: {UTIL: -5}}, uses)
    assert got[("busy_gpu_seconds_total", "over")] == 100
    assert got[("allocated_gpu_seconds_total", "over")] == 100
    assert got[("busy_gpu_seconds_total", "under")] == 0


def test_mig_activity_is_clamped_and_a_nan_falls_back_to_the_graphics_engine() -> None:
    """GPM answers a ratio: above 1 counts as 1, below 0 as 0; NaN (GPM could not tell) is
    skipped for graphics-engine activity, never served."""
    g = gpu(0)
    over, under, nan = mig(g, 1, 1), mig(g, 2, 2), mig(g, 3, 4)
    uses = {
        over.key: held(Claim("a", "over", "c")),
        under.key: held(Claim("a", "under", "c")),
        nan.key: held(Claim("a", "nan", "c")),
    }
    values = {
        g.key: {ENERGY: 0},
        over.key: {SM: 1.5},
        under.key: {SM: -0.5},
        nan.key: {SM: math.nan, GR: 0.25},
    }
    got = _run([over, under, nan], values, uses, gpus=[g])
    assert got[("busy_gpu_seconds_total", "over")] == got[("allocated_gpu_seconds_total", "over")]
    assert got[("allocated_gpu_seconds_total", "over")] == pytest.approx(100 / 7, abs=1e-3)
    assert got[("busy_gpu_seconds_total", "under")] == 0
    assert got[("busy_gpu_seconds_total", "nan")] == pytest.approx(0.25 * 400 / 7, abs=1e-3)
    assert all(math.isfinite(v) for v in got.values())


def test_a_device_one_container_holds_is_all_its_own_whatever_its_sm_share() -> None:
    """One holder: the GPU's utilization is its busy time and all of the GPU's energy
    is its, even where an SM share of its processes was measured (a stray process's
    SM share is no reason to split a device nobody else holds)."""
    g = gpu()
    uses = {
        g.key: held(Claim("ml", "a", "c", sm_percent=30, running=True), unattributed_sm_percent=10)
    }
    ledger = Ledger()
    ledger.update(snap(0, [g], values={g.key: {UTIL: 80, ENERGY: 0}}), uses)
    ledger.update(snap(100, [g], values={g.key: {UTIL: 80, ENERGY: 50_000_000}}), uses)
    got = served(ledger, uses)
    assert got[("busy_gpu_seconds_total", "a")] == 80
    assert got[("energy_joules_total", "a")] == 50_000
    assert got[("unattributed_energy_joules_total", "0/")] == 0


def test_a_mig_instance_created_while_running_is_charged_from_its_first_cycle() -> None:
    """Without Kubernetes each instance holds itself. The GPU stays the same object; a
    3g instance appears at 100: charged 3/7 of 100..200, and unallocated shrinks."""
    g = gpu(1)
    m1, m3 = mig(g, 7, 1), mig(g, 2, 3)
    ledger = Ledger()
    for t, entities in ((0, [m1]), (100, [m1, m3]), (200, [m1, m3])):
        ledger.update(snap(t, [g], entities), None)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "1/2")] == pytest.approx(300 / 7, abs=1e-3)
    assert got[("unallocated_gpu_seconds_total", "1/")] == pytest.approx(
        600 / 7 + 300 / 7, abs=1e-3
    )


def test_a_mig_instance_recreated_with_another_profile_is_charged_by_its_new_size() -> None:
    """The same GPU instance ID, destroyed and created as 3g instead of 1g: the device
    is a new one (same key), held 3/7 of the GPU from then on."""
    g = gpu(1)
    small, large = mig(g, 2, 1), mig(g, 2, 3)
    assert small.key == large.key
    ledger = Ledger()
    for t, m in ((0, small), (100, large), (200, large)):
        ledger.update(snap(t, [g], [m]), None)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "1/2")] == pytest.approx(400 / 7, abs=1e-3)


def test_an_unheld_instance_before_a_held_one_leaves_the_held_one_charged() -> None:
    g = gpu(1)
    free, used = mig(g, 1, 1), mig(g, 2, 3)
    uses = {used.key: held(Claim("ml", "a", "c"))}
    got = _run([free, used], {}, uses, gpus=[g])
    assert got[("allocated_gpu_seconds_total", "a")] == pytest.approx(300 / 7, abs=1e-3)


def test_while_holders_are_not_known_the_gpu_is_charged_to_unknown_not_to_a_holder() -> None:
    g = gpu()
    uses = {g.key: held(Claim("ml", "a", "c"))}
    ledger = Ledger()
    for t in (0, 100):
        ledger.update(snap(t, [g], values={g.key: {UTIL: 50}}), uses, "kubelet_throttled")
    got = served(ledger, uses)
    assert got[("attribution_unknown_gpu_seconds_total", "0/")] == 100
    assert ("allocated_gpu_seconds_total", "a") not in got


def test_while_holders_are_not_known_a_mig_gpu_is_unknown_by_its_instances_slices() -> None:
    """A 3g and a 1g instance of seven slices: 4/7 of the time and energy is unknown,
    3/7 unallocated and unattributed, whoever held what; an instance whose size is not
    known (0 slices read) counts for none of it."""
    g = gpu(1)
    m3, m1, odd = mig(g, 2, 3), mig(g, 7, 1), mig(g, 9, 0)
    uses = {m1.key: held(Claim("ml", "a", "c")), m3.key: held(Claim("ml", "b", "c"))}
    ledger = Ledger()
    for t, mj in ((0, 0), (70, 70_000_000)):
        values = {g.key: {ENERGY: mj}}
        ledger.update(snap(t, [g], [m3, m1, odd], values), uses, "kubelet_socket_missing")
    got = served(ledger, uses)
    assert got[("attribution_unknown_gpu_seconds_total", "1/")] == pytest.approx(40, abs=1e-3)
    assert got[("attribution_unknown_energy_joules_total", "1/")] == pytest.approx(40_000, 1e-6)
    assert got[("unallocated_gpu_seconds_total", "1/")] == pytest.approx(30, abs=1e-3)
    assert got[("unattributed_energy_joules_total", "1/")] == pytest.approx(30_000, 1e-6)


def test_without_kubernetes_a_devices_series_carry_no_pod_labels() -> None:
    """Each device holds itself: its series have the device's labels and none of a pod's
    (not even empty ones)."""
    g = gpu()
    ledger = Ledger()
    for t in (0, 10):
        ledger.update(snap(t, [g]), None)
    text, _ = AccountText().families(ledger.accounts(None, ()))
    (s,) = [s for s in samples(text) if s.name == "gpu_exporter_allocated_gpu_seconds_total"]
    assert s.labels == {
        "gpu": "0",
        "uuid": "GPU-0",
        "model_name": "NVIDIA H100 80GB HBM3",
        "hostname": "node",
    }
    assert s.value == 10


def test_busy_is_the_gpm_measure_on_whole_gpus_as_on_mig_and_utilization_without() -> None:
    """Issue 36 item 4: one measure of busy where the GPU has GPM: a whole GPU at 80 %
    utilization whose SMs were active 50 % of the time is busy 50 s of 100, as a MIG
    instance would be; a whole GPU without GPM readings falls back to its utilization."""
    g0, g1 = gpu(0), gpu(1)
    uses = {g0.key: held(Claim("a", "gpm", "c")), g1.key: held(Claim("a", "util", "c"))}
    values = {g0.key: {UTIL: 80, SM: 0.5}, g1.key: {UTIL: 80}}
    got = _run([g0, g1], values, uses)
    assert got[("busy_gpu_seconds_total", "gpm")] == pytest.approx(50)
    assert got[("busy_gpu_seconds_total", "util")] == pytest.approx(80)


def test_a_holder_that_ended_with_its_device_gone_leaves_the_others_windows_placed() -> None:
    """a and c share GPU 0 from 0; at 10 GPU 1 is gone with b, which ended at 6 (its window
    has no device to go on), a ended at 4, and c, which stopped at 3 and began again at 7,
    holds on (held at both cycles: charged all of it); d held half of it from 5 to 5.5.
    Each is charged its part, whatever the order of the windows."""
    g0, g1 = gpu(0), gpu(1)
    a, b, c = ("GPU-0", "ml", "a", "c"), ("GPU-1", "ml", "b", "c"), ("GPU-0", "ml", "c", "c")
    d = ("GPU-0", "ml", "d", "c")
    windows = {
        c: Window(7.0, 3.0, 0.5),
        b: Window(None, 6.0),
        a: Window(None, 4.0, 0.5),
        d: Window(5.0, 5.5, 0.5),
    }
    ledger = Ledger()
    half_c = Claim("ml", "c", "c", 0.5)
    uses = {g0.key: held(Claim("ml", "a", "c", 0.5), half_c), g1.key: held(Claim("ml", "b", "c"))}
    ledger.update(snap(0, [g0, g1]), uses)
    ledger.update(snap(10, [g0]), {g0.key: held(half_c)}, windows=windows)
    got = served(ledger)
    assert got[("allocated_gpu_seconds_total", "a")] == 2
    assert got[("allocated_gpu_seconds_total", "c")] == 5
    assert got[("allocated_gpu_seconds_total", "d")] == 0.25
    assert got[("unallocated_gpu_seconds_total", "0/")] == 2.75
    assert got[("allocated_gpu_seconds_total", "b")] == 0
