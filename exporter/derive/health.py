"""GPU health status per watched system (DCGM_EXP_GPU_HEALTH_STATUS), derived from NVML.

dcgm-exporter asks DCGM's health watches and publishes, per GPU, one series per
watched system (label ``health_watch``) whose value is the result: 0 pass,
10 warn, 20 fail, with the DCGM error code of the incident in
``health_error_code`` ("DCGM_FR_OK" when it passes). Without DCGM we derive the
same from what NVML reports:

- XIDs seen in the XID window, by their source in the XID catalog: memory ->
  MEM, nvlink -> NVLINK, pcie -> PCIE, mcu -> MCU, inforom -> INFOROM, power ->
  POWER, driver -> DRIVER; application, video and display XIDs route to the
  workload owner and leave the health unchanged;
- ECC: volatile double-bit errors (MEM fail), row-remap failure (MEM fail),
  row remap pending or pages pending retirement (MEM warn);
- thermal and power violation time that grew since the previous cycle (THERMAL
  or POWER warn);
- a GPU that stopped answering NVML (DRIVER fail, DCGM_FR_NVML_API);
- XIDs that take the whole GPU down and belong to no single watch, which DCGM
  reports under its ALL watch: 79 fallen off the bus (DCGM_FR_FALLEN_OFF_BUS) and
  95 uncontained memory error (DCGM_FR_UNCONTAINED_ERROR), both fail.

One incident per watched system: the worst one, with its code's severity and
category, which dcgm-exporter 4.8.3 and later add as ``health_error_severity`` and
``health_error_category`` from DCGM's table of error codes (dcgm-errors.csv beside this
module copies that table's rows for the codes the health status can carry). This module
produces data; the exposition renders it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from exporter.derive import xidcatalog
from exporter.frame import HealthSeries, WindowCounts
from exporter.snapshot import Snapshot

PASS, WARN, FAIL = 0, 10, 20
OK_CODE = "DCGM_FR_OK"
WATCHES = (
    "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL",
)  # fmt: skip
# GPU-wide XIDs: DCGM files them under its ALL watch, not under a subsystem
_GPU_WIDE: dict[int, str] = {79: "DCGM_FR_FALLEN_OFF_BUS", 95: "DCGM_FR_UNCONTAINED_ERROR"}

# XID source -> (watch, result, error code) of an XID of that source
_BY_SOURCE: dict[str, tuple[str, int, str]] = {
    "memory": ("MEM", WARN, "DCGM_FR_XID_ERROR"),
    "nvlink": ("NVLINK", FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL"),
    "pcie": ("PCIE", FAIL, "DCGM_FR_XID_ERROR"),
    "mcu": ("MCU", WARN, "DCGM_FR_XID_ERROR"),
    "inforom": ("INFOROM", WARN, "DCGM_FR_CORRUPT_INFOROM"),
    "power": ("POWER", WARN, "DCGM_FR_XID_ERROR"),
    "driver": ("DRIVER", WARN, "DCGM_FR_XID_ERROR"),
}
# XIDs that fail their watch (reset, RMA or a dead engine), with a more precise code
_FAILS: dict[int, str] = {
    46: "DCGM_FR_XID_ERROR",  # GPU timeout, reset required
    48: "DCGM_FR_VOLATILE_DBE_DETECTED",
    54: "DCGM_FR_XID_ERROR",  # auxiliary power not connected
    62: "DCGM_FR_XID_ERROR",  # micro-controller halt
    64: "DCGM_FR_ROW_REMAP_FAILURE",
    119: "DCGM_FR_XID_ERROR",  # GSP RPC timeout
    120: "DCGM_FR_XID_ERROR",  # GSP error
    140: "DCGM_FR_XID_ERROR",  # unrecovered ECC error
    143: "DCGM_FR_XID_ERROR",  # GPU initialization failure
    157: "DCGM_FR_ROW_REMAP_FAILURE",  # resource retirement failure
    158: "DCGM_FR_XID_ERROR",  # GPU fatal timeout
    169: "DCGM_FR_XID_ERROR",  # micro-controller halt
    171: "DCGM_FR_XID_ERROR",  # uncorrectable DRAM error
    172: "DCGM_FR_XID_ERROR",  # uncorrectable SRAM error
}


@dataclass(frozen=True, slots=True)
class HealthInputs:
    """What NVML told about one GPU; None where the value was not read."""

    xids: Mapping[int, int] = field(default_factory=dict)  # XID -> count in the window
    dbe_volatile: int | None = None
    row_remap_failure: int | None = None
    row_remap_pending: int | None = None
    retired_pending: int | None = None
    thermal_violation_ns: float | None = None  # growth since the previous cycle
    power_violation_ns: float | None = None
    lost: bool = False


def xid_incident(xid: int) -> tuple[str, int, str] | None:
    """(watch, result, error code) an XID raises, or None when it leaves health alone."""
    if xid in _GPU_WIDE:
        return "ALL", FAIL, _GPU_WIDE[xid]
    base = _BY_SOURCE.get(xidcatalog.source(xid))
    if base is None:
        return None
    watch, result, code = base
    if xid in _FAILS:
        return watch, FAIL, _FAILS[xid]
    return watch, result, code


def _incidents(inp: HealthInputs) -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    if inp.lost:
        found.append(("DRIVER", FAIL, "DCGM_FR_NVML_API"))
    if inp.dbe_volatile:
        found.append(("MEM", FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"))
    if inp.row_remap_failure:
        found.append(("MEM", FAIL, "DCGM_FR_ROW_REMAP_FAILURE"))
    if inp.row_remap_pending:
        found.append(("MEM", WARN, "DCGM_FR_PENDING_ROW_REMAP"))
    if inp.retired_pending:
        found.append(("MEM", WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"))
    if inp.thermal_violation_ns:
        found.append(("THERMAL", WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL"))
    if inp.power_violation_ns:
        found.append(("POWER", WARN, "DCGM_FR_CLOCK_THROTTLE_POWER"))
    for xid in sorted(x for x, n in inp.xids.items() if n > 0):
        inc = xid_incident(xid)
        if inc is not None:
            found.append(inc)
    return found


def gpu_health(inp: HealthInputs) -> tuple[HealthSeries, ...]:
    """One series per watched system, in WATCHES order; the worst incident of each, with
    its code's severity and category (:func:`grade`)."""
    worst: dict[str, tuple[int, str]] = {}
    for watch, result, code in _incidents(inp):
        if result > worst.get(watch, (PASS, OK_CODE))[0]:
            worst[watch] = (result, code)
    out = []
    for w in WATCHES:
        result, code = worst.get(w, (PASS, OK_CODE))
        out.append(HealthSeries(w, code, result, *grade(code)))
    return tuple(out)


_COUNTERS = {
    "dbe_volatile": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "retired_pending": "DCGM_FI_DEV_RETIRED_PENDING",
}
_VIOLATIONS = {
    "thermal_violation_ns": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "power_violation_ns": "DCGM_FI_DEV_POWER_VIOLATION",
}


class HealthTracker:
    """Builds each GPU's HealthInputs from a snapshot (values the metrics file enables)."""

    def __init__(self) -> None:
        self._prev: dict[tuple[str, str], float] = {}  # (GPU key, violation field) -> ns

    def update(
        self, snap: Snapshot, xids: WindowCounts | None = None
    ) -> dict[str, tuple[HealthSeries, ...]]:
        """Health of every GPU of the snapshot (answering or down), by GPU key."""
        in_window: dict[str, dict[int, int]] = {}
        for key, label, n in xids.series if xids else ():
            if label is not None:
                in_window.setdefault(key, {})[int(label)] = n
        out: dict[str, tuple[HealthSeries, ...]] = {}
        for g in snap.down:
            out[g.key] = gpu_health(HealthInputs(in_window.get(g.key, {}), lost=True))
        for g in snap.gpus:
            vals = snap.values.get(g.key, {})
            kw: dict[str, float | None] = {a: vals.get(n) for a, n in _COUNTERS.items()}
            for attr, name in _VIOLATIONS.items():
                now = vals.get(name)
                before = self._prev.get((g.key, name))
                kw[attr] = None if now is None or before is None else max(0.0, now - before)
                if now is not None:
                    self._prev[(g.key, name)] = float(now)
            out[g.key] = gpu_health(HealthInputs(in_window.get(g.key, {}), **kw))  # type: ignore[arg-type]
        live = {g.key for g in snap.gpus}
        for k in [k for k in self._prev if k[0] not in live]:
            del self._prev[k]
        return out


UNKNOWN_GRADE = ("UNKNOWN", "NONE")
"""The severity and category of a code missing from DCGM's table."""


@cache
def grades() -> dict[str, tuple[str, str]]:
    """DCGM error code -> (severity, category), from dcgm-errors.csv."""
    text = (resources.files("exporter.derive") / "dcgm-errors.csv").read_text(encoding="utf-8")
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    rows = [r for r in rows if not r[0].startswith("#")][1:]  # the first row names the columns
    return {code.strip(): (sev.strip(), cat.strip()) for code, sev, cat in rows}


def grade(code: str) -> tuple[str, str]:
    """(health_error_severity, health_error_category) of a DCGM error code."""
    return grades().get(code, UNKNOWN_GRADE)
