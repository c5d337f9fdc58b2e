"""FieldReader on the simulated driver through real pynvml: what a device lacks is asked
for once (its fallback once), and a counter sampled in part is no rate."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml as N
import pytest

from exporter import sim
from exporter.nvml.devices import Enumerator
from exporter.nvml.fields import FIELDS, Scope
from exporter.nvml.reader import FieldReader
from exporter.nvml.session import Session
from exporter.sim import Fault, ManualClock, SimDriver

TX, RX = "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"
NVLINK = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
READ = [FIELDS[n] for n in (TX, RX, NVLINK, "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK")]


class Rig:
    def __init__(self, driver: SimDriver, clock: ManualClock) -> None:
        self.driver, self.clock = driver, clock
        self.session = Session()
        self.session.open()
        self.reader = FieldReader(self.session, READ)
        self.gpu = Enumerator(self.session, "node-a").enumerate().gpus[0]

    def read(self) -> dict:
        got = self.reader.read(self.gpu, Scope.DEVICE)
        self.clock.advance(1.0)
        return got

    def errors(self, function: str) -> int:
        return self.session.errors.get((function, "NOT_SUPPORTED"), 0)


@pytest.fixture
def rig() -> Iterator[Rig]:
    clock = ManualClock()
    driver = sim.install(None, clock=clock, latency=False)
    r = Rig(driver, clock)
    try:
        yield r
    finally:
        r.session.close()
        sim.uninstall()


def test_a_batch_the_device_cannot_serve_is_asked_for_once(rig: Rig):
    """nvmlDeviceGetFieldValues NOT_SUPPORTED: its fields are read their fallback way
    (PCIe throughput from nvmlDeviceGetPcieThroughput, KB/s) and the batch is not
    asked for again every cycle."""
    rig.driver.inject(Fault("not_supported", gpu=0, function="nvmlDeviceGetFieldValues"))
    for _ in range(4):
        got = rig.read()
    assert rig.errors("nvmlDeviceGetFieldValues") == 1
    assert got[TX] > 0 and got[RX] > got[TX]  # the sim's PCIe receives more than it sends
    assert type(got[TX]) is int  # KB/s, an integer in DCGM as from fields 197/198
    assert NVLINK not in got and "DCGM_FI_DEV_MEMORY_TEMP" not in got
    assert {NVLINK, "DCGM_FI_DEV_MEMORY_TEMP"} <= rig.session.unsupported.keys()


def test_a_failing_fallback_is_asked_for_once(rig: Rig):
    """Field 197 NOT_SUPPORTED, and its fallback call too: the field is dropped on this
    GPU after one try of each, not retried every cycle."""
    rig.driver.inject(Fault("not_supported", gpu=0, field=197))
    rig.driver.inject(Fault("not_supported", gpu=0, function="nvmlDeviceGetPcieThroughput"))
    for _ in range(4):
        got = rig.read()
    assert TX not in got and RX in got
    assert rig.errors("nvmlDeviceGetPcieThroughput") == 1
    assert TX in rig.session.unsupported


def test_a_counter_primed_in_part_gives_no_rate(rig: Rig):
    """Field 449 sums NVLink TX (138) and RX (139): a first sample taken while RX failed
    is no sample, or the first rate would count RX since driver load as one second's."""
    gpu = rig.driver.gpus[0]
    gpu.unsupported_fields.add(139)
    rig.reader.prime([rig.gpu])
    gpu.unsupported_fields.discard(139)  # answers again by the first read
    rig.clock.advance(1.0)
    first = rig.read()
    assert NVLINK not in first  # a first sample; the rate comes with the next
    second = rig.read()
    # TX + RX KiB/s / 1000: the sim's H100 sends 96000 and receives 90000 MiB/s at
    # full load; GPU 0 runs at about 85 %
    assert 0.5 * 186 * 1024 < second[NVLINK] < 186 * 1024


def test_a_primed_device_has_its_rates_on_the_first_read(rig: Rig):
    """prime() takes the first sample of each counter, so the cycle after it publishes
    rates: (bytes now - bytes then) / seconds / 1024 for PCIe (fields 197/198)."""
    h = N.nvmlDeviceGetHandleByIndex(0)

    def counters() -> list[int]:
        return [v.value.ullVal for v in N.nvmlDeviceGetFieldValues(h, [(197, 0), (198, 0)])]

    before = counters()
    assert rig.reader.prime([rig.gpu]) is True
    assert rig.reader.prime([rig.gpu]) is False  # sampled already: nothing to wait for
    rig.clock.advance(2.0)
    after = counters()
    got = rig.read()
    want = [(b - a) / 2.0 / 1024 for a, b in zip(before, after, strict=True)]
    assert [got[TX], got[RX]] == [pytest.approx(w, abs=1) for w in want]
    assert NVLINK in got


def test_what_a_device_lacks_is_said_with_the_device_and_the_reason(rig: Rig):
    """session.unsupported names the GPU (index and UUID) and NVML's answer."""
    rig.driver.inject(Fault("not_supported", gpu=0, field=82))  # NVML_FI_DEV_MEMORY_TEMP
    rig.read()
    where = f"GPU 0 ({rig.gpu.uuid})"
    assert rig.session.unsupported["DCGM_FI_DEV_MEMORY_TEMP"] == f"{where}: field 82: NOT_SUPPORTED"


def test_one_device_that_cannot_be_primed_leaves_the_others_primed(rig: Rig):
    """GPU 0 already sampled, GPU 1 failing nvmlDeviceGetFieldValues: GPU 2 is still
    primed and has its rates on its first read."""
    gpus = Enumerator(rig.session, "node-a").enumerate().gpus
    rig.reader.prime(gpus[:1])
    rig.driver.inject(Fault("not_supported", gpu=1, function="nvmlDeviceGetFieldValues"))
    assert rig.reader.prime(gpus[:3]) is True
    rig.clock.advance(1.0)
    assert TX in rig.reader.read(gpus[2], Scope.DEVICE)


def test_ecc_entries_left_unset_are_not_supported_and_said_so():
    """ECC off (NVIDIA bug 2009232): the ECC entries come back untouched; the fields are
    dropped with that reason, and the GPU's other fields are served."""
    clock = ManualClock()
    sim.install({"gpus": [{"model": "NVIDIA H100 80GB HBM3", "ecc": False}]}, clock=clock)
    session = Session()
    session.open()
    try:
        ecc = [FIELDS["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], FIELDS["DCGM_FI_DEV_MEMORY_TEMP"]]
        gpu = Enumerator(session, "node-a").enumerate().gpus[0]
        got = FieldReader(session, ecc).read(gpu, Scope.DEVICE)
        assert list(got) == ["DCGM_FI_DEV_MEMORY_TEMP"]
        why = session.unsupported["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
        assert why == f"GPU 0 ({gpu.uuid}): field 4: left unset (ECC is off)"
    finally:
        session.close()
        sim.uninstall()


def test_a_mig_instance_is_named_by_gpu_instance_and_profile(rig: Rig):
    """What a MIG instance lacks is said of it, not of its GPU (default fleet: GPU 6 has
    seven 1g.10gb instances)."""
    rig.driver.inject(Fault("not_supported", gpu=6, function="nvmlDeviceGetMemoryInfo_v2"))
    inv = Enumerator(rig.session, "node-a").enumerate()
    inst = next(e for e in inv.entities() if e.is_mig and e.index == 6)
    reader = FieldReader(rig.session, [FIELDS["DCGM_FI_DEV_FB_USED"]])
    assert reader.read(inst, Scope.INSTANCE) == {}
    why = rig.session.unsupported["DCGM_FI_DEV_FB_USED"]
    assert why.startswith(f"GPU 6 MIG instance {inst.gi} ({inst.profile}): "), why
