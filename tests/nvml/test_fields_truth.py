"""Every served field against the simulator's own answer for its NVML source.

The expected value of each DCGM field is asked of the simulated driver through pynvml
with the NVML ids written out here from nvml.h (field ids, clock, sensor and threshold
types, GPM metric ids) and converted to DCGM's unit as REFERENCE.md gives it, not
through exporter/nvml/fields.py's tables. The simulator answers every source with a
value of its own (graphics vs SM clock, PCIe TX vs RX, each GPM pipe and engine, bytes
not whole MiB), so a field read from the wrong source or converted with the wrong
factor fails here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pynvml as N
import pytest

from exporter.catalog.metricsfile import parse
from exporter.catalog.renames import renames
from exporter.nvml.fields import FIELDS, Scope, Source
from tests.sim.handles import handle, mig_handles
from tests.support.catalogs import ALL_ROWS_TEXT, EXTENDED
from tests.support.simnode import node

MIB = 1 << 20
ALL_LINKS = 0xFFFFFFFF
_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t


def fv(h: Any, fid: int, scope: int = 0) -> float | None:
    """One nvmlDeviceGetFieldValues entry's value, None unless NVML_SUCCESS."""
    (v,) = N.nvmlDeviceGetFieldValues(h, [(fid, scope)])
    if v.nvmlReturn != 0 or v.timestamp == 0:
        return None
    return getattr(v.value, _MEMBER[v.valueType])


def _mem(attr: str, unit: int = MIB) -> Callable[[Any], int]:
    return lambda h: getattr(N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2), attr) // unit


def _watts(call: str) -> Callable[[Any], float]:
    return lambda h: getattr(N, call)(h) / 1000.0  # mW -> W


def _field(fid: int, scale: float = 1.0) -> Callable[[Any], float | None]:
    def read(h: Any) -> float | None:
        v = fv(h, fid)
        return None if v is None else v * scale

    return read


# What each field is at one instant (nvml.h ids; DCGM units: REFERENCE.md)
INSTANT: dict[str, Callable[[Any], Any]] = {
    "DCGM_FI_DEV_GPU_UTIL": lambda h: N.nvmlDeviceGetUtilizationRates(h).gpu,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda h: N.nvmlDeviceGetUtilizationRates(h).memory,
    "DCGM_FI_DEV_ENC_UTIL": lambda h: N.nvmlDeviceGetEncoderUtilization(h)[0],
    "DCGM_FI_DEV_DEC_UTIL": lambda h: N.nvmlDeviceGetDecoderUtilization(h)[0],
    "DCGM_FI_DEV_FB_TOTAL": _mem("total"),
    "DCGM_FI_DEV_FB_FREE": _mem("free"),
    "DCGM_FI_DEV_FB_USED": _mem("used"),
    "DCGM_FI_DEV_FB_RESERVED": _mem("reserved"),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": _mem("total", 1),
    "DCGM_FI_DEV_FB_FREE_BYTES": _mem("free", 1),
    "DCGM_FI_DEV_FB_USED_BYTES": _mem("used", 1),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": _mem("reserved", 1),
    "DCGM_FI_DEV_GPU_TEMP": lambda h: N.nvmlDeviceGetTemperature(h, 0),  # NVML_TEMPERATURE_GPU
    "DCGM_FI_DEV_MEMORY_TEMP": _field(82),  # NVML_FI_DEV_MEMORY_TEMP
    # nvmlTemperatureThresholds_t: SHUTDOWN 0, SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3
    "DCGM_FI_DEV_SHUTDOWN_TEMP": lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 0),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 1),
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 2),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": lambda h: N.nvmlDeviceGetTemperatureThreshold(h, 3),
    "DCGM_FI_DEV_POWER_USAGE": _watts("nvmlDeviceGetPowerUsage"),
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": _field(186, 0.001),  # NVML_FI_DEV_POWER_INSTANT, mW
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": _watts("nvmlDeviceGetPowerManagementLimit"),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": _watts("nvmlDeviceGetEnforcedPowerLimit"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _field(83),  # ..._TOTAL_ENERGY_CONSUMPTION, mJ
    # nvmlClockType_t: GRAPHICS 0, SM 1, MEM 2, VIDEO 3
    "DCGM_FI_DEV_SM_CLOCK": lambda h: N.nvmlDeviceGetClockInfo(h, 1),
    "DCGM_FI_DEV_MEM_CLOCK": lambda h: N.nvmlDeviceGetClockInfo(h, 2),
    "DCGM_FI_DEV_VIDEO_CLOCK": lambda h: N.nvmlDeviceGetClockInfo(h, 3),
    "DCGM_FI_DEV_MAX_SM_CLOCK": lambda h: N.nvmlDeviceGetMaxClockInfo(h, 1),
    "DCGM_FI_DEV_MAX_MEM_CLOCK": lambda h: N.nvmlDeviceGetMaxClockInfo(h, 2),
    "DCGM_FI_DEV_MAX_VIDEO_CLOCK": lambda h: N.nvmlDeviceGetMaxClockInfo(h, 3),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": N.nvmlDeviceGetCurrentClocksEventReasons,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": N.nvmlDeviceGetCurrentClocksEventReasons,
    "DCGM_FI_DEV_PSTATE": N.nvmlDeviceGetPerformanceState,
    "DCGM_FI_DEV_FAN_SPEED": N.nvmlDeviceGetFanSpeed,
    # NVML_FI_DEV_PERF_POLICY_*: ns clock-limited by each reason
    "DCGM_FI_DEV_POWER_VIOLATION": _field(74),
    "DCGM_FI_DEV_THERMAL_VIOLATION": _field(75),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": _field(76),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": _field(77),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": _field(78),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": _field(79),
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION": _field(80),
    "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": _field(81),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _field(94),
    "DCGM_FI_DEV_PCIE_LINK_GEN": N.nvmlDeviceGetCurrPcieLinkGeneration,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": N.nvmlDeviceGetCurrPcieLinkWidth,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _field(3),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _field(4),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _field(5),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _field(6),
    "DCGM_FI_DEV_RETIRED_SBE": _field(29),
    "DCGM_FI_DEV_RETIRED_DBE": _field(30),
    "DCGM_FI_DEV_RETIRED_PENDING": _field(31),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _field(142),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _field(143),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": _field(144),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _field(145),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": _field(38),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": _field(45),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": _field(52),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": _field(59),
    # NVLink5 (Blackwell): NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS (215) and
    # _EFFECTIVE_ERRORS (219), asked over all links (scope 0xFFFFFFFF) as DCGM does
    "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS": lambda h: fv(h, 215, 0xFFFFFFFF),
    "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS": lambda h: fv(h, 219, 0xFFFFFFFF),
}

# Fields DCGM types DCGM_FT_INT64 (dcgmlib/src/dcgm_fields.cpp, DCGM 4.6.0): served as
# integers (a rate truncated), never as a float
INT64 = {
    f"DCGM_FI_{n}"
    for n in (
        "DEV_BOARD_LIMIT_VIOLATION",
        "DEV_CLOCKS_EVENT_REASONS",
        "DEV_DEC_UTIL",
        "DEV_ECC_DBE_AGG_TOTAL",
        "DEV_ECC_DBE_VOL_TOTAL",
        "DEV_ECC_SBE_AGG_TOTAL",
        "DEV_ECC_SBE_VOL_TOTAL",
        "DEV_ENC_UTIL",
        "DEV_FAN_SPEED",
        "DEV_FB_FREE",
        "DEV_FB_RESERVED",
        "DEV_FB_TOTAL",
        "DEV_FB_USED",
        "DEV_LOW_UTIL_VIOLATION",
        "DEV_MAX_MEM_CLOCK",
        "DEV_MAX_SM_CLOCK",
        "DEV_MAX_VIDEO_CLOCK",
        "DEV_MEM_CLOCK",
        "DEV_MEM_COPY_UTIL",
        "DEV_PCIE_LINK_GEN",
        "DEV_PCIE_LINK_WIDTH",
        "DEV_PCIE_RX_THROUGHPUT",
        "DEV_PCIE_TX_THROUGHPUT",
        "DEV_POWER_VIOLATION",
        "DEV_RELIABILITY_VIOLATION",
        "DEV_ROW_REMAP_PENDING",
        "DEV_SM_CLOCK",
        "DEV_SYNC_BOOST_VIOLATION",
        "DEV_THERMAL_VIOLATION",
        "DEV_TOTAL_APP_CLOCKS_VIOLATION",
        "DEV_TOTAL_BASE_CLOCKS_VIOLATION",
        "DEV_TOTAL_ENERGY_CONSUMPTION",
        "DEV_VIDEO_CLOCK",
    )
}

# Watts with their fraction (DCGM_FT_DOUBLE): never rounded to an integer
DOUBLE = {
    f"DCGM_FI_DEV_{n}"
    for n in ("POWER_USAGE", "POWER_USAGE_INSTANT", "POWER_MGMT_LIMIT", "ENFORCED_POWER_LIMIT")
}

# Counters served as a rate: (field ids summed, scopeId, divisor of bytes per second)
RATES = {
    # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES (197/198), bytes -> KB/s (DCGM: KiB)
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ((197,), 0, 1024.0),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ((198,), 0, 1024.0),
    # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX + RX (138, 139) in KiB, over all links; DCGM
    # divides the KiB/s by 1000
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ((138, 139), ALL_LINKS, 1000.0),
}

# without fields 197/198: nvmlDeviceGetPcieThroughput(nvmlPcieUtilCounter_t TX 0, RX 1)
SAMPLED = {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT": 0, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": 1}

# GPM metric id (nvmlGpmMetricId_t) and DCGM's factor: percent -> ratio, MiB/s -> B/s
GPM = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (1, 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": (2, 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": (3, 0.01),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": (4, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (5, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": (6, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": (7, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_DMMA_ACTIVE": (8, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": (9, 0.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": (10, 0.01),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": (11, 0.01),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": (12, 0.01),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": (13, 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (20, MIB),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (21, MIB),
    "DCGM_FI_PROF_NVDEC0_ACTIVE": (30, 0.01),
    "DCGM_FI_PROF_NVJPG0_ACTIVE": (40, 0.01),
    "DCGM_FI_PROF_NVOFA0_ACTIVE": (50, 0.01),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (60, MIB),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (61, MIB),
}

# every row with a series, and dcgm-exporter 4.10's names beside the old ones
_NEW = [
    line
    for line in EXTENDED.with_name("metrics-4.10.csv").read_text().splitlines()
    if line.startswith("DCGM_") and " label," not in line
    and line.split(",")[0] not in ALL_ROWS_TEXT
]  # fmt: skip
_TEXT = ALL_ROWS_TEXT + "\n".join(_NEW) + "\n"
CATALOG = parse(_TEXT, "all-rows-and-4.10.csv", dcgm47=True)  # the new names as 4.10 reads them
LISTED = {line.split(",")[0] for line in _TEXT.splitlines() if line.startswith("DCGM_")}
INSTANCE = {n for n, f in FIELDS.items() if f.scope is Scope.INSTANCE}


def _gpm(s0: Any, s1: Any) -> dict[str, float]:
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM)
    mg.sample1, mg.sample2 = s0, s1
    for i, (metric, _) in enumerate(GPM.values()):
        mg.metrics[i].metricId = metric
    N.nvmlGpmMetricsGet(mg)
    out = {}
    for i, (name, (_, factor)) in enumerate(GPM.items()):
        m = mg.metrics[i]
        if m.nvmlReturn == 0 and not math.isnan(m.value):
            out[name] = m.value * factor
    return out


def _handles() -> dict[tuple[int, int | None], Any]:
    """(GPU index, GPU instance id or None) -> handle."""
    out: dict[tuple[int, int | None], Any] = {}
    for i in range(N.nvmlDeviceGetCount()):
        h = handle(i)
        out[(i, None)] = h
        try:
            mig = N.nvmlDeviceGetMigMode(h)[0]
        except N.NVMLError:
            mig = 0
        for m in mig_handles(h) if mig else ():
            out[(i, N.nvmlDeviceGetGpuInstanceId(m))] = m
    return out


def _counters(h: Any) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (ids, scope, _) in RATES.items():
        got = [fv(h, fid, scope) for fid in ids]
        out[name] = None if None in got else float(sum(got))  # type: ignore[arg-type]
    return out


def _truth(h: Any, names: set[str]) -> dict[str, Any]:
    out = {}
    for name in names & INSTANT.keys():
        try:
            v = INSTANT[name](h)
        except N.NVMLError:
            continue
        if v is not None:
            out[name] = v
    return out


Key = tuple[int, int | None]  # (GPU index, GPU instance id or None)


class Reference:
    """The test's own readings of every device at two instants 1 s apart: what the
    collector's second cycle must serve."""

    def __init__(self) -> None:
        self.handles = _handles()
        self.gpm: dict[Key, list[Any]] = {}
        self.counters: dict[Key, list[dict[str, float | None]]] = {}
        for key, h in self.handles.items():
            if N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                self.gpm[key] = []

    def take(self) -> None:
        """One instant's GPM samples and counters."""
        for key, samples in self.gpm.items():
            samples.append(N.nvmlGpmSampleAlloc())
            N.nvmlGpmSampleGet(self.handles[key], samples[-1])
        for key, h in self.handles.items():
            if key[1] is None:
                self.counters.setdefault(key, []).append(_counters(h))

    def want(self, key: Key) -> dict[str, Any]:
        """What ``key`` serves now: a MIG GPU its device-level fields, its instances the
        instance-level ones, each under the names the metrics file lists."""
        hs = self.handles
        mig_gpu = key[1] is None and any(k[0] == key[0] and k[1] is not None for k in hs)
        names = INSTANCE if key[1] is not None else set(FIELDS) - (INSTANCE if mig_gpu else set())
        want = _truth(hs[key], names)
        if key in self.gpm:
            want.update({k: v for k, v in _gpm(*self.gpm[key]).items() if k in names})
        exact = {}  # rates before DCGM's truncation to an integer
        for name, (_, _, div) in RATES.items() if key[1] is None else ():
            a, b = (c[name] for c in self.counters[key])
            if a is not None and b is not None:
                exact[name] = (b - a) / 1.0 / div
                want[name] = int(exact[name])
            elif name in SAMPLED:  # a driver before fields 197/198: its 20 ms sample, KB/s
                want[name] = N.nvmlDeviceGetPcieThroughput(hs[key], SAMPLED[name])
        for r in renames():  # the DCGM 4.7 name: the old one's reading x its factor
            if r.old in want and r.new not in INSTANT and not r.is_label:
                want[r.new] = exact.get(r.old, want[r.old]) * r.scale
        return {k: v for k, v in want.items() if k in LISTED}


FLEETS = [None, *(f"exporter/sim/fleets/{f}.yaml" for f in ("mixed", "h200", "a100-80gb-535"))]
# the one actively cooled board (fan speed) beside a passively cooled one
FAN = {"gpus": [{"model": "NVIDIA RTX 6000 Ada Generation"}, {"model": "NVIDIA L40S"}]}
FLEETS.append(FAN)  # type: ignore[arg-type]


@pytest.mark.parametrize("fleet", FLEETS, ids=["default", "mixed", "h200", "a100-535", "fan"])
def test_every_field_is_the_simulators_answer_for_its_nvml_source(fleet):
    with node(fleet, catalog=CATALOG) as n:
        N.nvmlInit()  # the test's own reference, beside the collector's
        ref = Reference()
        ref.take()
        n.cycle(1.0)
        ref.take()
        want = {key: ref.want(key) for key in ref.handles}
        snap = n.cycle(1.0)
    served = {
        (d.index, d.gi if d.is_mig else None): snap.values.get(d.key, {})
        for d in (*snap.gpus, *snap.entities)
    }
    known = INSTANT.keys() | GPM.keys() | RATES.keys()
    for key, fields in want.items():
        values = served[key]
        for name, expected in fields.items():
            assert name in values, (key, name, expected)
            slack = 1 if name in RATES else 1e-9  # a timestamp's rounding, then truncation
            assert values[name] == pytest.approx(expected, rel=1e-6, abs=slack), (key, name)
            assert name not in INT64 or type(values[name]) is int, (key, name)
            assert name not in DOUBLE or type(values[name]) is float, (key, name)
        # nothing served from these sources that the driver does not answer
        assert {m for m in values if m in known} - fields.keys() == set(), key
    assert sum(map(len, want.values())) > 100


def test_every_read_field_has_its_truth_here():
    """A field added to exporter/nvml/fields.py is checked against the driver here too."""
    from exporter.catalog.fieldnames import aliases
    from exporter.catalog.renames import renames

    derived = {r.new for r in renames()} | set(aliases())
    read = {
        n
        for n, f in FIELDS.items()
        if f.source in (Source.FIELD, Source.CALL, Source.GPM) and n not in derived
    }
    mine = INSTANT.keys() | RATES.keys() | GPM.keys()
    assert read - mine == set()
    assert mine - read <= derived  # the byte fields defined under their DCGM 4.7 names
