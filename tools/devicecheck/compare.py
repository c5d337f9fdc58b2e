"""Every exported field nvidia-smi can show, its nvidia-smi counterpart, tolerance and verdict.

Each cycle nvidia-smi is read just before (a) and just after (b) the exporter's
collection (x). Rules:

- exact: identity and limits; x equals a or b (numbers within the slack shown);
- spread: instantaneous values; x lies between a and b, widened by the slack;
- counter: cumulative counts; a - slack <= x <= b + slack (they only grow);
- bits: a bitmask; x is a or b, or holds every bit set in both and none set in neither.

Presence is checked too: a value nvidia-smi shows that the exporter does not serve is
MISSING, one the exporter serves where nvidia-smi shows N/A is EXTRA. Instance-level
fields (framebuffer) are compared on whole GPUs: a MIG-enabled GPU's memory is served
per instance, and compared with ``nvidia-smi mig`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

Row = dict[str, Any]
SmiRow = Mapping[str, str | None]


def _num(text: str) -> float:
    return float(text)


def _hex(text: str) -> float:
    return float(int(text, 16))


def _pstate(text: str) -> float:
    return float(text.lstrip("P"))


def _yes(text: str) -> float:
    return 1.0 if text.lower() in ("yes", "enabled", "1") else 0.0


@dataclass(frozen=True)
class Check:
    """One exported field and how nvidia-smi's answer is compared with it."""

    field: str  # a DCGM field, or a label of every GPU series (UUID, modelName, ...)
    smi: str  # the --query-gpu field
    rule: str  # exact | spread | counter | bits
    slack: float = 0.0
    rel: float = 0.0  # slack relative to the value
    parse: Callable[[str], Any] = _num
    instance: bool = False  # compared on whole GPUs only
    absent_as: float | None = None  # nvidia-smi's N/A agrees with this exported value
    read: Callable[[SmiRow], Any] | None = None  # from the whole row instead of `smi`

    @property
    def tolerance(self) -> str:
        if self.rule == "exact":
            return "exact" if not self.slack else f"equal within {self.slack:g}"
        if self.rule == "counter":
            return "before <= x <= after" + (f" (+-{self.slack:g})" if self.slack else "")
        if self.rule == "bits":
            return "bits set in both reads set, in neither clear"
        extra = " + ".join(
            s
            for s in (
                f"{self.slack:g}" if self.slack else "",
                f"{self.rel:.0%}" if self.rel else "",
            )
            if s
        )
        return "between the two reads" + (f", +-{extra}" if extra else "")

    def smi_value(self, row: SmiRow | None) -> Any:
        if row is None:
            return None
        if self.read is not None:
            return self.read(row)
        text = row.get(self.smi)
        return None if text is None else self.parse(text)


def _fabric_status(row: SmiRow) -> float | None:
    """DCGM's fabric manager status from nvidia-smi's fabric.state and fabric.status."""
    state = (row.get("fabric.state") or "").lower()
    if state == "completed":
        return 3.0 if (row.get("fabric.status") or "").lower() == "success" else 4.0
    return {"not started": 1.0, "in progress": 2.0, "not supported": 0.0}.get(state)


def _ident(field: str, smi: str) -> Check:
    return Check(field, smi, "exact", parse=str)


CHECKS: tuple[Check, ...] = (
    _ident("UUID", "uuid"),
    _ident("modelName", "name"),
    _ident("pci_bus_id", "pci.bus_id"),
    _ident("DCGM_FI_DEV_UUID", "uuid"),
    _ident("DCGM_FI_DEV_NAME", "name"),
    _ident("DCGM_FI_DEV_PCI_BUSID", "pci.bus_id"),
    _ident("DCGM_FI_DEV_SERIAL", "serial"),
    _ident("DCGM_FI_DRIVER_VERSION", "driver_version"),
    _ident("DCGM_FI_DEV_VBIOS_VERSION", "vbios_version"),
    _ident("DCGM_FI_DEV_INFOROM_IMAGE_VER", "inforom.img"),
    Check("DCGM_FI_DEV_GPU_UTIL", "utilization.gpu", "spread", 5),
    Check("DCGM_FI_DEV_MEM_COPY_UTIL", "utilization.memory", "spread", 5),
    Check("DCGM_FI_DEV_ENC_UTIL", "utilization.encoder", "spread", 5),
    Check("DCGM_FI_DEV_DEC_UTIL", "utilization.decoder", "spread", 5),
    Check("DCGM_FI_DEV_FB_TOTAL", "memory.total", "exact", 1, instance=True),
    Check("DCGM_FI_DEV_FB_RESERVED", "memory.reserved", "exact", 1, instance=True),
    Check("DCGM_FI_DEV_FB_USED", "memory.used", "spread", 1, instance=True),
    Check("DCGM_FI_DEV_FB_FREE", "memory.free", "spread", 1, instance=True),
    Check("DCGM_FI_DEV_GPU_TEMP", "temperature.gpu", "spread", 1),
    Check("DCGM_FI_DEV_MEMORY_TEMP", "temperature.memory", "spread", 1),
    Check("DCGM_FI_DEV_POWER_USAGE", "power.draw", "spread", 1, 0.02),
    Check("DCGM_FI_DEV_POWER_USAGE_INSTANT", "power.draw.instant", "spread", 5, 0.05),
    Check("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power.limit", "exact", 0.01),
    Check("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "enforced.power.limit", "exact", 0.01),
    Check("DCGM_FI_DEV_SM_CLOCK", "clocks.current.sm", "spread", 1),
    Check("DCGM_FI_DEV_MEM_CLOCK", "clocks.current.memory", "spread", 1),
    Check("DCGM_FI_DEV_VIDEO_CLOCK", "clocks.current.video", "spread", 1),
    Check("DCGM_FI_DEV_MAX_SM_CLOCK", "clocks.max.sm", "exact"),
    Check("DCGM_FI_DEV_MAX_MEM_CLOCK", "clocks.max.memory", "exact"),
    Check("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie.link.gen.current", "spread"),
    Check("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie.link.width.current", "spread"),
    Check("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons.active", "bits", parse=_hex),
    Check("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "clocks_event_reasons.active", "bits", parse=_hex),
    Check("DCGM_FI_DEV_PSTATE", "pstate", "spread", parse=_pstate),
    Check("DCGM_FI_DEV_FAN_SPEED", "fan.speed", "spread", 1),
    Check("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc.errors.corrected.volatile.total", "counter"),
    Check("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc.errors.uncorrected.volatile.total", "counter"),
    Check("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc.errors.corrected.aggregate.total", "counter"),
    Check("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc.errors.uncorrected.aggregate.total", "counter"),
    Check("DCGM_FI_DEV_RETIRED_SBE", "retired_pages.single_bit_ecc.count", "counter"),
    Check("DCGM_FI_DEV_RETIRED_DBE", "retired_pages.double_bit.count", "counter"),
    Check("DCGM_FI_DEV_RETIRED_PENDING", "retired_pages.pending", "spread", parse=_yes),
    Check("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_rows.correctable", "counter"),
    Check("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_rows.uncorrectable", "counter"),
    Check("DCGM_FI_DEV_ROW_REMAP_PENDING", "remapped_rows.pending", "spread", parse=_yes),
    Check("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remapped_rows.failure", "spread", parse=_yes),
    Check("DCGM_FI_DEV_POWER_VIOLATION", "clocks_event_reasons_counters.sw_power_cap", "counter"),
    Check(
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "clocks_event_reasons_counters.sync_boost", "counter"
    ),
    Check(
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
        "fabric.state",
        "spread",
        absent_as=0,
        read=_fabric_status,
    ),
    Check("DCGM_FI_DEV_FABRIC_CLIQUE_ID", "fabric.cliqueId", "exact", absent_as=0),
)
# the --query-gpu fields the checks read (fabric.status through the status check)
QUERY = tuple(dict.fromkeys([*(c.smi for c in CHECKS), "fabric.status", "mig.mode.current"]))


def exported(snap: Snapshot, gpu: Device, name: str) -> Any:
    """What the exporter serves for a GPU: a DCGM field's value or a label of its series."""
    got = snap.values.get(gpu.key, {}).get(name)
    if got is not None:
        return got
    return dict(gpu.labels).get(name)


def judge(check: Check, a: Any, x: Any, b: Any) -> str:
    """ok, n/a (neither has a value), MISSING, EXTRA or MISMATCH."""
    seen = [v for v in (a, b) if v is not None]
    if not seen:
        if x is None or (check.absent_as is not None and x == check.absent_as):
            return "n/a" if x is None else "ok"
        return "EXTRA"
    if x is None:
        return "MISSING"
    if check.parse is str:
        return "ok" if str(x) in seen else "MISMATCH"
    x = float(x)
    if check.rule == "exact":
        return "ok" if any(abs(x - v) <= check.slack for v in seen) else "MISMATCH"
    lo, hi = min(seen), max(seen)
    if check.rule == "bits":
        both, either = int(lo) & int(hi), int(lo) | int(hi)
        return (
            "ok" if x in seen or (int(x) & both == both and int(x) & ~either == 0) else "MISMATCH"
        )
    if check.rule == "counter":
        lo, hi = (a if a is not None else lo), (b if b is not None else hi)
    tol = check.slack + check.rel * max(abs(lo), abs(hi))
    return "ok" if lo - tol <= x <= hi + tol else "MISMATCH"


def compare_cycle(
    cycle: int,
    snap: Snapshot,
    before: Mapping[int, SmiRow],
    after: Mapping[int, SmiRow],
    mig_gpus: Iterable[str],
) -> list[Row]:
    """One row per GPU and check: the three values, the tolerance and the verdict."""
    mig = set(mig_gpus)
    rows = []
    for gpu in snap.gpus:
        ra, rb = before.get(gpu.index), after.get(gpu.index)
        for check in CHECKS:
            if check.instance and gpu.key in mig:
                continue
            a, b = check.smi_value(ra), check.smi_value(rb)
            x = exported(snap, gpu, check.field)
            rows.append(
                {
                    "cycle": cycle,
                    "gpu": gpu.index,
                    "field": check.field,
                    "nvidia_smi": check.smi,
                    "before": a,
                    "exporter": x,
                    "after": b,
                    "tolerance": check.tolerance,
                    "verdict": judge(check, a, x, b),
                }
            )
    return rows
