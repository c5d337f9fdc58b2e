"""GPU health status per watched system (DCGM_EXP_GPU_HEALTH_STATUS), derived from NVML.

dcgm-exporter asks DCGM's health watches and publishes, per GPU, one series per
watched system (label ``health_watch``) whose value is the result: 0 pass,
10 warn, 20 fail, with the DCGM error code of the incident in
``health_error_code`` ("DCGM_FR_OK" when it passes). Without DCGM we derive the
same from what NVML reports:

- XIDs as DCGM's health watch grades them (dcgmxids.py: DCGM 4.5.3's table for
  dcgm-exporter 4.8.2, 4.6's for later releases): the GPU-wide ones under ALL, the others
  under their subsystem's watch, and none for the XIDs DCGM ignores. As DCGM keeps an XID
  in the GPU's history for the hostengine's life, an XID graded once stays until the
  exporter restarts (the -x window does not apply);
- ECC: volatile double-bit errors (MEM fail), row-remap failure (MEM fail),
  row remap pending or pages pending retirement (MEM warn);
- thermal and power violation time that grew since the previous cycle (THERMAL
  or POWER warn);
- a GPU that stopped answering NVML (DRIVER fail, DCGM_FR_NVML_API).

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

from exporter.derive import dcgmxids
from exporter.derive.dcgmxids import DEFAULT_DCGM
from exporter.frame import HealthSeries
from exporter.snapshot import Snapshot

PASS, WARN, FAIL = 0, 10, 20
OK_CODE = "DCGM_FR_OK"
WATCHES = (
    "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL",
)  # fmt: skip
_RESULTS = {"WARN": WARN, "FAIL": FAIL}


@dataclass(frozen=True, slots=True)
class HealthInputs:
    """What NVML told about one GPU; None where the value was not read."""

    xids: Mapping[int, int] = field(default_factory=dict)  # XID -> count since start (> 0: seen)
    dbe_volatile: int | None = None
    row_remap_failure: int | None = None
    row_remap_pending: int | None = None
    retired_pending: int | None = None
    thermal_violation_ns: float | None = None  # growth since the previous cycle
    power_violation_ns: float | None = None
    lost: bool = False
    volta: bool = False  # a Volta chip (DCGM 4.6 grades XID 93 on Volta only)


def xid_incident(
    xid: int, dcgm: str = DEFAULT_DCGM, volta: bool = False
) -> tuple[str, int, str] | None:
    """(watch, result, error code) an XID raises under DCGM release ``dcgm``, or None when
    that release's health watch ignores it."""
    g = dcgmxids.grade(xid, dcgm, volta)
    return None if g is None else (g.watch, _RESULTS[g.result], g.code)


def _incidents(inp: HealthInputs, dcgm: str) -> list[tuple[str, int, str]]:
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
        inc = xid_incident(xid, dcgm, inp.volta)
        if inc is not None:
            found.append(inc)
    return found


def gpu_health(inp: HealthInputs, dcgm: str = DEFAULT_DCGM) -> tuple[HealthSeries, ...]:
    """One series per watched system, in WATCHES order; the worst incident of each, with
    its code's severity and category (:func:`grade`); XIDs graded as DCGM ``dcgm`` does."""
    worst: dict[str, tuple[int, str]] = {}
    for watch, result, code in _incidents(inp, dcgm):
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
    """Builds each GPU's HealthInputs from a snapshot (values the metrics file enables), with
    its XID history: every XID the GPU reported since the exporter started, as DCGM
    ``dcgm`` keeps it (never cleared while the GPU is known)."""

    def __init__(self, dcgm: str = DEFAULT_DCGM) -> None:
        self.dcgm = dcgm
        self._prev: dict[tuple[str, str], float] = {}  # (GPU key, violation field) -> ns
        # GPU key -> XID -> count; bounded: only XIDs DCGM grades, only GPUs still known
        self._history: dict[str, dict[int, int]] = {}

    def _xids(self, snap: Snapshot) -> dict[str, dict[int, int]]:
        """Record the XIDs DCGM grades that ``snap`` counts; every known GPU's history."""
        keys = {g.uuid: g.key for g in snap.gpus + snap.down if not g.is_mig}
        table = dcgmxids.releases()[self.dcgm]
        for uuid, _gi, _ci, xid, n in snap.xid.counts:
            key = keys.get(uuid)
            if key is not None and n > 0 and xid in table:
                seen = self._history.setdefault(key, {})
                seen[xid] = max(seen.get(xid, 0), n)
        for k in [k for k in self._history if k not in keys.values()]:
            del self._history[k]
        return self._history

    def update(self, snap: Snapshot) -> dict[str, tuple[HealthSeries, ...]]:
        """Health of every GPU of the snapshot (answering or down), by GPU key."""
        history = self._xids(snap)
        out: dict[str, tuple[HealthSeries, ...]] = {}
        for g in snap.down:
            inp = HealthInputs(history.get(g.key, {}), lost=True, volta=is_volta(g.model))
            out[g.key] = gpu_health(inp, self.dcgm)
        for g in snap.gpus:
            vals = snap.values.get(g.key, {})
            kw: dict[str, float | None] = {a: vals.get(n) for a, n in _COUNTERS.items()}
            for attr, name in _VIOLATIONS.items():
                now = vals.get(name)
                before = self._prev.get((g.key, name))
                kw[attr] = None if now is None or before is None else max(0.0, now - before)
                if now is not None:
                    self._prev[(g.key, name)] = float(now)
            inp = HealthInputs(history.get(g.key, {}), volta=is_volta(g.model), **kw)  # type: ignore[arg-type]
            out[g.key] = gpu_health(inp, self.dcgm)
        live = {g.key for g in snap.gpus}
        for k in [k for k in self._prev if k[0] not in live]:
            del self._prev[k]
        return out


_VOLTA_MODELS = ("V100", "TITAN V", "GV100")


def is_volta(model: str) -> bool:
    """Whether a GPU of this product name has a Volta chip (V100, TITAN V, Quadro GV100)."""
    return any(m in model for m in _VOLTA_MODELS)


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
