"""Every DCGM field this exporter serves, and where NVML gets it.

One row per field: its scope (one series per physical GPU, or one per GPU *and*
per MIG instance), the NVML source (a batch field id, a driver call shared with
other fields, a GPM metric, the XID event thread, or an identity string read
once) and the conversion to DCGM's unit. For a field read by nvmlDeviceGetFieldValues,
a shared call or GPM, its entry here is its whole NVML read; docs/architecture.md
("Where a metric lives") names every file of a family's story.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml as N

from exporter.catalog.fieldnames import aliases
from exporter.catalog.renames import renamed, renames

MIB = 1024 * 1024
ALL_LINKS = 0xFFFFFFFF  # NVML scopeId meaning "summed over every NVLink"


class Scope(enum.Enum):
    """Which series a field has: DEVICE, one per physical GPU (temperature, power, clocks,
    ECC, PCIe); INSTANCE, one per whole GPU and per MIG instance (framebuffer, GPM).
    Members are compared by identity; their values mean nothing."""

    DEVICE, INSTANCE = range(2)


class Source(enum.Enum):
    """Where NVML gets a field: FIELD, nvmlDeviceGetFieldValues, batched per device; CALL,
    one NVML call shared by the fields that read it; GPM, a GPM metric from two samples
    (Hopper and newer); XID, the XID event thread; LABEL, an identity string read once at
    enumeration; DERIVED, computed by the exporter from other fields (DCGM_EXP_* families);
    P2P, nvmlDeviceGetP2PStatus per GPU pair, read once per set of GPUs; FABRIC,
    nvmlDeviceGetGpuFabricInfoV per GPU (exporter/nvml/fabric.py). Members are compared by
    identity; their values mean nothing."""

    FIELD, CALL, GPM, XID, LABEL, DERIVED, P2P, FABRIC = range(8)


@dataclass(frozen=True, slots=True)
class Call:
    """One NVML call: ``pynvml.<function>(handle, *args)``; ``fallback`` if the driver lacks it."""

    function: str
    args: tuple = ()
    fallback: Call | None = None
    system: bool = False  # takes no device handle (nvmlSystemGet*)
    static: bool = False  # set by the board (VBIOS): read once per device while NVML is up


@dataclass(frozen=True, slots=True)
class Field:
    """How one DCGM field is read and converted to DCGM's unit."""

    name: str
    scope: Scope
    source: Source
    field_ids: tuple[tuple[int, int], ...] = ()  # (fieldId, scopeId); several are summed
    call: Call | None = None
    pick: Callable[[Any], Any] | None = None  # extracts this field from the call's result
    gpm_metric: int = 0
    scale: float = 1.0
    integer: bool = True  # DCGM exports this field as an integer
    rate: float = 0.0  # > 0: DCGM serves the counter's change per second divided by this
    needs: tuple[str, ...] = ()  # fields read (not exported) for a DERIVED family
    # read this way instead on a device that lacks the first (an older driver's call, a
    # newer architecture's field ids): the same DCGM field, in the same unit
    fallback: Field | None = None

    @property
    def is_label(self) -> bool:
        return self.source is Source.LABEL

    def convert(self, raw: Any) -> int | float:
        v = raw * self.scale if self.scale != 1.0 else raw
        return int(v) if self.integer else float(v)


D, INST = Scope.DEVICE, Scope.INSTANCE
FIELDS: dict[str, Field] = {}


def _add(f: Field) -> None:
    FIELDS[f.name] = f


def _fid(
    name: str,
    *ids: int,
    scope_id: int = 0,
    scale: float = 1.0,
    integer: bool = True,
    rate: float = 0.0,
    fallback: Field | None = None,
) -> None:
    ids_ = tuple((i, scope_id) for i in ids)
    kw = {"scale": scale, "integer": integer, "rate": rate, "fallback": fallback}
    _add(Field(name, D, Source.FIELD, ids_, **kw))  # type: ignore[arg-type]


def _call(
    name: str,
    call: Call,
    pick: Callable[[Any], Any] | None = None,
    *,
    scope: Scope = D,
    scale: float = 1.0,
    integer: bool = True,
) -> None:
    _add(Field(name, scope, Source.CALL, (), call, pick, scale=scale, integer=integer))


def _gpm(name: str, metric: int, scale: float, scope: Scope = INST) -> None:
    _add(Field(name, scope, Source.GPM, gpm_metric=metric, scale=scale, integer=False))


def _label(name: str, call: Call, pick: Callable[[Any], Any] | None = None) -> None:
    _add(Field(name, D, Source.LABEL, (), call, pick))


# --- utilization (absent on MIG-enabled GPUs: NVML answers NotSupported) ---
_util = Call("nvmlDeviceGetUtilizationRates")
_call("DCGM_FI_DEV_GPU_UTIL", _util, lambda u: u.gpu)
_call("DCGM_FI_DEV_MEM_COPY_UTIL", _util, lambda u: u.memory)
_call("DCGM_FI_DEV_ENC_UTIL", Call("nvmlDeviceGetEncoderUtilization"), lambda r: r[0])
_call("DCGM_FI_DEV_DEC_UTIL", Call("nvmlDeviceGetDecoderUtilization"), lambda r: r[0])

# --- framebuffer: per whole GPU and per MIG instance; bytes -> MiB ---
_mem = Call("nvmlDeviceGetMemoryInfo", (N.nvmlMemory_v2,), fallback=Call("nvmlDeviceGetMemoryInfo"))


def _mib_of(attr: str, unit: int = MIB) -> Callable[[Any], int]:
    # the ctypes field itself: pynvml's __getattribute__ only decodes bytes, and these
    # are read for every MIG instance every cycle
    get = ctypes.Structure.__getattribute__
    return lambda m: get(m, attr) // unit


for _n, _attr in (("TOTAL", "total"), ("FREE", "free"), ("USED", "used"), ("RESERVED", "reserved")):
    _call(f"DCGM_FI_DEV_FB_{_n}", _mem, _mib_of(_attr), scope=INST)
    # DCGM 4.7 names (dcgm-exporter 4.9): the same reading in bytes, not rounded to MiB
    _b = "DCGM_FI_DEV_FB_CAPACITY_BYTES" if _n == "TOTAL" else f"DCGM_FI_DEV_FB_{_n}_BYTES"
    _call(_b, _mem, _mib_of(_attr, 1), scope=INST)

# --- temperature (C) ---
_call(
    "DCGM_FI_DEV_GPU_TEMP",
    Call(
        "nvmlDeviceGetTemperatureV",
        (N.NVML_TEMPERATURE_GPU,),
        fallback=Call("nvmlDeviceGetTemperature", (N.NVML_TEMPERATURE_GPU,)),
    ),
)
_fid("DCGM_FI_DEV_MEMORY_TEMP", N.NVML_FI_DEV_MEMORY_TEMP)
for _n, _t in (
    ("SLOWDOWN_TEMP", N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("SHUTDOWN_TEMP", N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ("GPU_MAX_OP_TEMP", N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ("MEM_MAX_OP_TEMP", N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
):
    _call(f"DCGM_FI_DEV_{_n}", Call("nvmlDeviceGetTemperatureThreshold", (_t,), static=True))

# --- power (mW -> W) and energy (mJ since driver load) ---
_w = 0.001
_call("DCGM_FI_DEV_POWER_USAGE", Call("nvmlDeviceGetPowerUsage"), scale=_w, integer=False)
_fid("DCGM_FI_DEV_POWER_USAGE_INSTANT", N.NVML_FI_DEV_POWER_INSTANT, scale=_w, integer=False)
_call(
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    Call("nvmlDeviceGetPowerManagementLimit"),
    scale=_w,
    integer=False,
)
_call(
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    Call("nvmlDeviceGetEnforcedPowerLimit"),
    scale=_w,
    integer=False,
)
_fid("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)

# --- clocks (MHz) ---
for _n, _c in (
    ("SM", N.NVML_CLOCK_SM),
    ("MEM", N.NVML_CLOCK_MEM),
    ("VIDEO", N.NVML_CLOCK_VIDEO),
):
    _call(f"DCGM_FI_DEV_{_n}_CLOCK", Call("nvmlDeviceGetClockInfo", (_c,)))
    _max = Call("nvmlDeviceGetMaxClockInfo", (_c,), static=True)
    _call(f"DCGM_FI_DEV_MAX_{_n}_CLOCK", _max)
_reasons = Call(
    "nvmlDeviceGetCurrentClocksEventReasons",
    fallback=Call("nvmlDeviceGetCurrentClocksThrottleReasons"),
)
_call("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", _reasons)
_call("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", _reasons)  # pre-4.0 DCGM name
_call("DCGM_FI_DEV_PSTATE", Call("nvmlDeviceGetPerformanceState"))
_call("DCGM_FI_DEV_FAN_SPEED", Call("nvmlDeviceGetFanSpeed"))

# --- throttling: time spent clock-limited by each reason (ns, cumulative) ---
for _n, _f in (
    ("POWER", N.NVML_FI_DEV_PERF_POLICY_POWER),
    ("THERMAL", N.NVML_FI_DEV_PERF_POLICY_THERMAL),
    ("SYNC_BOOST", N.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
    ("BOARD_LIMIT", N.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT),
    ("LOW_UTIL", N.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION),
    ("RELIABILITY", N.NVML_FI_DEV_PERF_POLICY_RELIABILITY),
    ("TOTAL_APP_CLOCKS", N.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS),
    ("TOTAL_BASE_CLOCKS", N.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS),
):
    _fid(f"DCGM_FI_DEV_{_n}_VIOLATION", _f)

# --- PCIe ---
_fid("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", N.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
# A throughput in KB/s from NVML's cumulative byte counters (fields 197/198, from NVML 12.5,
# R555) over the last two samples; older drivers: nvmlDeviceGetPcieThroughput, a 20 ms
# sample in KB/s.
for _n, _fid_bytes, _counter in (
    ("TX", 197, N.NVML_PCIE_UTIL_TX_BYTES),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    ("RX", 198, N.NVML_PCIE_UTIL_RX_BYTES),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
):
    _name = f"DCGM_FI_DEV_PCIE_{_n}_THROUGHPUT"
    _sampled = Field(_name, D, Source.CALL, call=Call("nvmlDeviceGetPcieThroughput", (_counter,)))
    _fid(_name, _fid_bytes, rate=1024.0, fallback=_sampled)
_call("DCGM_FI_DEV_PCIE_LINK_GEN", Call("nvmlDeviceGetCurrPcieLinkGeneration"))
_call("DCGM_FI_DEV_PCIE_LINK_WIDTH", Call("nvmlDeviceGetCurrPcieLinkWidth"))

# --- ECC, page retirement (pre-Ampere), row remapping (Ampere and newer) ---
_fid("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL)
_fid("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL)
_fid("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", N.NVML_FI_DEV_ECC_SBE_AGG_TOTAL)
_fid("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL)
_fid("DCGM_FI_DEV_RETIRED_SBE", N.NVML_FI_DEV_RETIRED_SBE)
_fid("DCGM_FI_DEV_RETIRED_DBE", N.NVML_FI_DEV_RETIRED_DBE)
_fid("DCGM_FI_DEV_RETIRED_PENDING", N.NVML_FI_DEV_RETIRED_PENDING)
_fid("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", N.NVML_FI_DEV_REMAPPED_COR)
_fid("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", N.NVML_FI_DEV_REMAPPED_UNC)
_fid("DCGM_FI_DEV_ROW_REMAP_PENDING", N.NVML_FI_DEV_REMAPPED_PENDING)
_fid("DCGM_FI_DEV_ROW_REMAP_FAILURE", N.NVML_FI_DEV_REMAPPED_FAILURE)

# --- NVLink (totals over all links) ---
# Field 449 as DCGM computes it: NVML's cumulative TX+RX KiB counters, their change
# between the last two samples per second, divided by 1000 (about MiB/s). No value
# on a device's first sample.
_fid(
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    scope_id=ALL_LINKS,
    rate=1000.0,
)
# Blackwell (NVLink5) has no per-lane DL totals (nvml.h): as DCGM, which asks them with
# scope 0 there (blank), these have no value on Blackwell.
for _dl, _n in ((38, "CRC_FLIT"), (45, "CRC_DATA"), (52, "REPLAY"), (59, "RECOVERY")):
    _fid(f"DCGM_FI_DEV_NVLINK_{_n}_ERROR_COUNT_TOTAL", _dl)
# NVLink5's own counters under DCGM's names (fields 1213, 1219; DCGM 4.6's other names in
# dcgm-fields.csv), summed over links with scopeId UINT_MAX as DCGM asks them on NVLink5
# (DcgmCMUtils.cpp NvmlFieldRequiresNvLinkAggregate): link recovery events (NVML 215) and
# errors FEC did not correct (219).
_fid("DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS", 215, scope_id=ALL_LINKS)
_fid("DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", 219, scope_id=ALL_LINKS)

# --- GPM profiling (Hopper and newer; per GPU and per MIG instance) ---
_pct, _mibs = 0.01, float(MIB)
for _n, _m in (
    ("GR_ENGINE_ACTIVE", N.NVML_GPM_METRIC_GRAPHICS_UTIL),
    ("SM_ACTIVE", N.NVML_GPM_METRIC_SM_UTIL),
    ("SM_OCCUPANCY", N.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("PIPE_TENSOR_ACTIVE", N.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("PIPE_TENSOR_DFMA_ACTIVE", N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL),
    ("PIPE_TENSOR_HMMA_ACTIVE", N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL),
    ("PIPE_TENSOR_IMMA_ACTIVE", N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL),
    ("PIPE_INT_ACTIVE", N.NVML_GPM_METRIC_INTEGER_UTIL),
    ("DRAM_ACTIVE", N.NVML_GPM_METRIC_DRAM_BW_UTIL),
    ("PIPE_FP64_ACTIVE", N.NVML_GPM_METRIC_FP64_UTIL),
    ("PIPE_FP32_ACTIVE", N.NVML_GPM_METRIC_FP32_UTIL),
    ("PIPE_FP16_ACTIVE", N.NVML_GPM_METRIC_FP16_UTIL),
    ("PIPE_TENSOR_DMMA_ACTIVE", 8),  # NVML_GPM_METRIC_DMMA_TENSOR_UTIL
    ("NVDEC0_ACTIVE", 30),  # NVML_GPM_METRIC_NVDEC_0_UTIL
    ("NVJPG0_ACTIVE", 40),  # NVML_GPM_METRIC_NVJPG_0_UTIL
    ("NVOFA0_ACTIVE", 50),  # NVML_GPM_METRIC_NVOFA_0_UTIL
):
    _gpm(f"DCGM_FI_PROF_{_n}", _m, _pct)
# PCIe and NVLink traffic are GPU-level, as in DCGM (dcgm_fields.cpp): on a MIG GPU they are
# sampled on the GPU itself, and repeat per GPU instance as other device-level fields do.
_gpm("DCGM_FI_PROF_PCIE_TX_BYTES", N.NVML_GPM_METRIC_PCIE_TX_PER_SEC, _mibs, D)
_gpm("DCGM_FI_PROF_PCIE_RX_BYTES", N.NVML_GPM_METRIC_PCIE_RX_PER_SEC, _mibs, D)
_gpm("DCGM_FI_PROF_NVLINK_TX_BYTES", N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, _mibs, D)
_gpm("DCGM_FI_PROF_NVLINK_RX_BYTES", N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, _mibs, D)

# --- NVLink fabric registration and health (NVSwitch and NVL systems; fabric.py) ---
for _n in (
    "FABRIC_MANAGER_STATUS",  # DCGM's dcgmFabricManagerStatus_t
    "FABRIC_MANAGER_ERROR",  # a DCGM return code
    "FABRIC_MANAGER_ERROR_CODE",  # the older name of field 171
    "FABRIC_CLIQUE_ID",
    "FABRIC_HEALTH_MASK",  # bit fields
    "FABRIC_HEALTH_SUMMARY",
):
    _add(Field(f"DCGM_FI_DEV_{_n}", D, Source.FABRIC))

# --- XIDs, from the event thread ---
# Last XID seen on the GPU (sticky, like dcgm-exporter), with err_code and err_msg labels.
_add(Field("DCGM_FI_DEV_XID_ERRORS", D, Source.XID))
# XIDs by code since the exporter started, per GPU or MIG instance: alert on this one.
_add(Field("DCGM_EXP_XID_ERRORS_TOTAL", INST, Source.XID))

# --- dcgm-exporter's own families, derived from other fields (exporter/exposition/dcgm.py) ---
_xid_in = ("DCGM_FI_DEV_XID_ERRORS",)  # the XID event thread
# XIDs per GPU and code within -x/--xid-count-window-size
_add(Field("DCGM_EXP_XID_ERRORS_COUNT", D, Source.DERIVED, needs=_xid_in))
# cycles each clock-event reason was active within --clock-events-count-window-size
_add(
    Field(
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
        D,
        Source.DERIVED,
        needs=("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",),
    )
)
# times each clock-event reason newly appeared since the exporter started (edges)
_clock_in = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",)
_add(Field("DCGM_EXP_CLOCK_EVENTS_TOTAL", D, Source.DERIVED, needs=_clock_in))
# pass (0) / warn (10) / fail (20) per watched system, from XIDs, ECC, remaps, violations
_health_in = (
    *_xid_in,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_POWER_VIOLATION",
)
_add(Field("DCGM_EXP_GPU_HEALTH_STATUS", D, Source.DERIVED, needs=_health_in))
# NVML's NVLink P2P status code per GPU and peer GPU
_add(Field("DCGM_EXP_P2P_STATUS", D, Source.P2P))

# --- label fields: read once when a device is enumerated ---
_label("DCGM_FI_DRIVER_VERSION", Call("nvmlSystemGetDriverVersion", system=True))
_label("DCGM_FI_NVML_VERSION", Call("nvmlSystemGetNVMLVersion", system=True))
_label(
    "DCGM_FI_CUDA_DRIVER_VERSION",
    Call("nvmlSystemGetCudaDriverVersion", system=True),
    lambda v: f"{v // 1000}.{v % 1000 // 10}",
)
_label("DCGM_FI_DEV_NAME", Call("nvmlDeviceGetName"))
_label("DCGM_FI_DEV_SERIAL", Call("nvmlDeviceGetSerial"))
_label("DCGM_FI_DEV_UUID", Call("nvmlDeviceGetUUID"))
_label("DCGM_FI_DEV_VBIOS_VERSION", Call("nvmlDeviceGetVbiosVersion"))
_label("DCGM_FI_DEV_INFOROM_IMAGE_VER", Call("nvmlDeviceGetInforomImageVersion"))
# nvmlBrandType_t 0-16, by the names DCGM gives them (DcgmCacheManager.cpp 10453-10468:
# "Grid", "NVIDIA vGaming"); an unknown number reads Unknown, as in DCGM
_BRANDS = (
    "Unknown", "Quadro", "Tesla", "NVS", "Grid", "GeForce", "Titan",
    "NVIDIA Virtual Applications", "NVIDIA Virtual PC", "NVIDIA Virtual Compute Server",
    "NVIDIA RTX Virtual Workstation", "NVIDIA vGaming", "Quadro RTX", "NVIDIA RTX",
    "NVIDIA", "GeForce RTX", "Titan RTX",
)  # fmt: skip
_label(
    "DCGM_FI_DEV_BRAND",
    Call("nvmlDeviceGetBrand"),
    lambda b: dict(enumerate(_BRANDS)).get(b, "Unknown"),
)
_label("DCGM_FI_DEV_MINOR_NUMBER", Call("nvmlDeviceGetMinorNumber"))
_label("DCGM_FI_DEV_PCI_BUSID", Call("nvmlDeviceGetPciInfo_v3"), lambda p: p.busId)


# --- DCGM 4.7 names (exporter/catalog/dcgm-names.csv): served beside the old ones, whichever
# a metrics file lists; fields defined above under their new name (bytes) are kept ---
for _r in renames():
    if _r.new not in FIELDS:
        _add(renamed(FIELDS[_r.old], _r))  # the old field's reading, new name and unit
# A DCGM 4.6 alias that DCGM 4.7 made a field of its own in another unit (GPU_UTIL_RATIO:
# GPU_UTIL's 0-100 in DCGM 4.6, a 0-1 ratio in 4.7): FIELDS holds the 4.7 field, DCGM46 the
# alias, read for releases that ship DCGM 4.6 or older (Release.dcgm47 false)
DCGM46: dict[str, Field] = {}
for _alias, _same in aliases().items():  # DCGM 4.6 canonical names: same field ID, same unit
    _f = dataclasses.replace(FIELDS[_same], name=_alias)
    if _alias in FIELDS:
        DCGM46[_alias] = _f
    else:
        _add(_f)


def with_inputs(fields: Iterable[Field]) -> list[Field]:
    """``fields`` plus the fields their DERIVED families need read (each once, in order)."""
    out: dict[str, Field] = {}
    for f in fields:
        for name in f.needs:
            out.setdefault(name, FIELDS[name])
        out.setdefault(f.name, f)
    return list(out.values())
