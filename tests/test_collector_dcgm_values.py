"""Values as DCGM gives them where NVML's answer needs care: ECC turned off, MIG mode
changes, GPM traffic on MIG GPUs, GPM NaN, per-process memory on MIG, MPS clients,
Blackwell's NVLink counters, and a lost GPU in the XID event set."""

from __future__ import annotations

import dataclasses
import math

from exporter.frame import Owner
from exporter.nvml.processes import ProcessReader
from exporter.sim import Fault
from exporter.workloads.mapper import PodMap
from exporter.workloads.sharing import split_shared
from tests.support.simnode import H100, blackwell, node, until

ECC = [
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
]
MIXED = "exporter/sim/fleets/mixed.yaml"  # GPU 1: A100 with MIG


def test_ecc_fields_are_not_served_when_ecc_is_off():
    """DCGM's workaround for NVIDIA bug 2009232: an ECC entry NVML left untouched (time
    stamp and latency 0) is NOT_SUPPORTED, not a count of 0."""
    fleet = {"gpus": [{"model": H100, "ecc": False}, {"model": H100}]}
    with node(fleet) as n:
        snap = n.cycle()
        off, on = n.gpu(snap, 0), n.gpu(snap, 1)
        assert [f for f in ECC if f in off] == []
        assert [f for f in ECC if f in on] == ECC
        assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in n.col.session.unsupported


def test_not_supported_is_asked_again_when_mig_mode_changes():
    """Utilization is NOT_SUPPORTED on MIG-enabled GPUs only (nvml.h): a mode, not a
    capability of the board."""
    with node(MIXED) as n:
        assert "DCGM_FI_DEV_GPU_UTIL" not in n.gpu(n.cycle(), 1)
        n.driver.inject(Fault("mig_reconfigure", gpu=1, mig=False))
        n.cycle()
        assert "DCGM_FI_DEV_GPU_UTIL" in n.gpu(n.cycle(), 1)


def test_gpm_pcie_and_nvlink_bytes_are_per_gpu_on_mig_gpus():
    """DCGM serves PROF_PCIE_*/PROF_NVLINK_* at GPU level (dcgm_fields.cpp); per GPU
    instance they would repeat the GPU's traffic and sums over instances overcount."""
    with node() as n:  # GPU 6: seven MIG instances
        n.cycle()
        snap = n.cycle()
        gpu6 = n.gpu(snap, 6)
        names = ["DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES"]
        assert all(gpu6[name] > 0 for name in names)
        for inst in [e for e in snap.entities if e.parent is not None and e.index == 6]:
            values = snap.values[inst.key]
            assert not any(name in values for name in names)
            assert "DCGM_FI_PROF_SM_ACTIVE" in values  # an instance's own GPM stays


def test_a_gpm_nan_is_left_out():
    """DcgmGpmManager blanks NaN: GPU 3 is idle, its SM occupancy is NaN."""
    with node() as n:
        n.cycle()
        idle = n.gpu(n.cycle(), 3)
        assert not any(isinstance(v, float) and math.isnan(v) for v in idle.values())
        assert "DCGM_FI_PROF_SM_OCCUPANCY" not in idle
        assert idle["DCGM_FI_PROF_SM_ACTIVE"] == 0


def test_per_process_memory_on_mig_is_not_available():
    """NVML gives no per-process memory on MIG: no container gets 0 MiB for it."""
    fleet = {
        "gpus": [
            {
                "model": H100,
                "mig": [
                    {
                        "profile": "3g.40gb",
                        "processes": [
                            {"pid": 7001, "used_memory_mib": 4000},
                            {"pid": 7002, "used_memory_mib": 3000},
                        ],
                    }
                ],
            }
        ]
    }
    with node(fleet) as n:
        snap = n.cycle()
        (inst,) = [e for e in snap.entities if e.parent is not None]
        procs = ProcessReader(n.col.session).read(inst)
        assert [(p.pid, p.used_mib) for p in procs] == [(7001, None), (7002, None)]
        a, b = Owner("ns", "a", "c"), Owner("ns", "b", "c")
        podmap = PodMap(owners={inst.key: (a, b)})
        snap = dataclasses.replace(n.cycle(), processes={inst.key: procs})
        (split,) = split_shared(snap, podmap, {7001: a, 7002: b}.get)
        assert split.fb == {}  # not two containers at 0 MiB


def test_mps_clients_are_listed():
    procs = [
        {"pid": 5001, "used_memory_mib": 1000, "type": "mps"},
        {"pid": 5002, "used_memory_mib": 2000, "type": "mps"},
    ]
    with node({"gpus": [{"model": H100, "processes": procs}]}) as n:
        snap = n.cycle()
        got = ProcessReader(n.col.session).read(snap.gpus[0])
        assert [(p.pid, p.used_mib) for p in got] == [(5001, 1000), (5002, 2000)]


def test_blackwell_nvlink5_counters_are_served_under_dcgms_names(monkeypatch):
    """NVML-REVIEW N9: DCGM asks the DL totals (fields 38, 59) with scope 0 on Blackwell too,
    which has none (blank), and serves the NVLink5 counters as their own fields 1213 and
    1219 (dcgm_fields.h; summed with scopeId UINT_MAX, DcgmCMUtils.cpp)."""
    board = blackwell(monkeypatch)
    with node({"driver_version": "570.124.06", "gpus": [{"model": board}]}) as n:
        n.cycle()
        values = n.gpu(n.cycle(), 0)
        # 18 links; the simulated board counts 1 recovery and 2 effective errors per link
        assert values["DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS"] == 18
        assert values["DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS"] == 36
        for dl in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"):
            assert f"DCGM_FI_DEV_NVLINK_{dl}_ERROR_COUNT_TOTAL" not in values


def test_a_lost_gpu_leaves_the_event_set_and_the_others_xids_are_counted():
    """nvmlEventSetWait_v2 answers GPU_IS_LOST for the whole set while one of its GPUs
    is lost: the watcher rebuilds the set without it, between two cycles."""
    with node() as n:
        n.cycle()
        n.driver.inject(Fault("lost", gpu=1))

        def rebuilt() -> bool:  # the sets the watcher holds: one, without GPU 1
            sets = list(n.driver.events.sets.values())
            return len(sets) == 1 and 1 not in sets[0].registered

        until("a set without the lost GPU", rebuilt, seconds=5)
        n.driver.inject(Fault("xid", gpu=0, xid=48))
        uuid0 = n.driver.gpus[0].uuid

        def counted() -> bool:
            return any(u == uuid0 and x == 48 for u, _, _, x, _ in n.col.xid.state().counts)

        until("GPU 0's XID", counted, seconds=5)
        n.driver.inject(Fault("xid", gpu=0, xid=43))
        until("the next one", lambda: len(n.col.xid.state().counts) == 2, seconds=5)
