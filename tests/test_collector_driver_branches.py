"""The exporter on older driver branches and pynvml releases: the older call where a field
id is missing, a field named unsupported once, early-R535 process entries, the first
nvmlEventSetWait, a pynvml without a wrapper, and a node with no visible GPU."""

from __future__ import annotations

import pynvml
import pytest

from exporter.nvml.processes import ProcessReader
from exporter.poller import Poller
from exporter.sim import Fault
from tests.support.exposition import find
from tests.support.simnode import CATALOG, H100, node, until

PROCS = [
    {"pid": 4101, "used_memory_mib": 20480, "sm_util": 30},
    {"pid": 4102, "used_memory_mib": 16384, "sm_util": 20},
    {"pid": 4103, "used_memory_mib": 8192, "sm_util": 10},
]


def on(driver: str, **gpu) -> dict:
    return {"driver_version": driver, "gpus": [{"model": H100, "load": {"util": 50}, **gpu}]}


def errors(col, code: str) -> int:
    return sum(n for f, c, n in col.session.error_counts() if c == code)


def test_pcie_throughput_from_nvmldevicegetpciethroughput_before_r555(monkeypatch):
    """Fields 197/198 first appear in NVML 12.5 (R555); R550 answers INVALID_ARGUMENT."""
    with node(on("550.127.08")) as n:
        snaps = [n.cycle() for _ in range(4)]
        tx = n.gpu(snaps[-1], 0)["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"]
        rx = n.gpu(snaps[-1], 0)["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"]
        # the board moves 2400 / 5200 MiB/s at full load, about half of it at 50 %
        assert 0.3 * 2400 * 1024 < tx < 0.7 * 2400 * 1024
        assert 0.3 * 5200 * 1024 < rx < 0.7 * 5200 * 1024
        assert errors(n.col, "INVALID_ARGUMENT") == 0


def test_a_field_the_driver_does_not_know_is_named_once_and_not_asked_again():
    """Field 186 (POWER_INSTANT) appears in NVML 12.2 (R535)."""
    with node(on("525.147.05")) as n:
        snaps = [n.cycle() for _ in range(5)]
        assert "DCGM_FI_DEV_POWER_USAGE_INSTANT" not in n.gpu(snaps[-1], 0)
        assert "DCGM_FI_DEV_POWER_USAGE" in n.gpu(snaps[-1], 0)
        assert "DCGM_FI_DEV_POWER_USAGE_INSTANT" in n.col.session.unsupported
        assert errors(n.col, "INVALID_ARGUMENT") == 0


@pytest.mark.parametrize("driver", ["535.54.03", "535.104.05", "470.256.02"])
def test_process_entries_are_read_with_the_drivers_layout(driver):
    """Early R535 writes 32-byte entries (nvitop #75/#79): PIDs after the first were
    misread; R470 has no _v3 at all."""
    with node(on(driver, processes=PROCS)) as n:
        snap = n.cycle()
        procs = ProcessReader(n.col.session).read(snap.gpus[0])
        assert [(p.pid, p.used_mib) for p in procs] == [(4101, 20480), (4102, 16384), (4103, 8192)]


V2_MISSING = {"missing_functions": ["nvmlEventSetWait_v2"]}
# NVML-REVIEW N15: DCGM takes the first wait when v2 answers NOT_SUPPORTED too (DCM:7823-7827)
V2_UNSUPPORTED = {"faults": [{"at": 0, "kind": "not_supported", "function": "nvmlEventSetWait_v2"}]}


@pytest.mark.parametrize("v2", [V2_MISSING, V2_UNSUPPORTED], ids=["missing", "not-supported"])
def test_xids_through_the_first_event_wait_when_v2_is_missing(v2):
    fleet = {
        **v2,
        "gpus": [{"model": H100}, {"model": H100, "mig": [{"profile": "3g.40gb"}]}],
    }
    with node(fleet) as n:
        n.cycle()
        n.driver.inject(Fault("xid", gpu=0, xid=48))
        n.driver.inject(Fault("xid", gpu=1, xid=31, gi=2))  # no instance ids in v1's data
        gpus = [g.uuid for g in n.driver.gpus]

        def seen() -> set:
            return {(gpus.index(u), gi, x) for u, gi, _, x, _ in n.col.xid.state().counts}

        until("both XIDs", lambda: seen() == {(0, None, 48), (1, None, 31)})
        assert n.col.xid.healthy


def test_a_pynvml_without_a_wrapper_falls_back_to_the_older_call(monkeypatch):
    """pynvml 12.560 has no nvmlDeviceGetTemperatureV: the fallback reads the temperature."""
    monkeypatch.delattr(pynvml, "nvmlDeviceGetTemperatureV")
    with node(on("580.95.05")) as n:
        assert 20 < n.gpu(n.cycle(), 0)["DCGM_FI_DEV_GPU_TEMP"] < 90


async def test_a_node_without_a_visible_gpu_is_ready_with_none():
    with node({"gpus": []}) as n:
        poller = Poller(CATALOG, n.col, interval_s=1.0, timeout_s=5.0)
        await poller.cycle()
        snap = poller.snapshot
        assert snap is not None and snap.ok and snap.gpus == () and not snap.problems
        assert poller.readiness() == (True, [])
        text = poller.exposition.plain.decode()
        assert [s.value for s in find(text, "gpu_exporter_gpus")] == [0]
        poller.close()
