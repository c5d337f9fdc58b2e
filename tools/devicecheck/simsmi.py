"""nvidia-smi for the simulated driver: what the real tool would print, from the TRUE state.

The stand-in answers the commands the device check runs (``--query-gpu``, ``mig -lgi``,
``-lci``, ``-lgip``, ``dmon -s t``) in nvidia-smi's formats, reading the simulated
GPUs' state directly (their model, counters and the state's own methods as they were
before any skew), never through NVML or pynvml. So the exporter's whole path (pynvml,
the simulated library, unit conversion, labels) is checked against an independent
source, and a skewed state method (``skew``) shows up as a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from exporter.sim.devices import GpuState, MiB
from exporter.sim.driver import SimDriver
from tools.devicecheck.nvsmi import Run, SmiError

# State methods a skew may change, captured here before any skew.
SKEWABLE = ("temperature_c", "power_mw", "util", "sm_clock", "energy_mj", "fan_percent")
TRUE: dict[str, Callable[..., Any]] = {name: getattr(GpuState, name) for name in SKEWABLE}
_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}


@contextmanager
def skewed(skews: Sequence[tuple[str, float]]) -> Iterator[None]:
    """The simulated driver answers ``method() + delta`` for each skew; restored after."""
    for name, delta in skews:
        if name not in TRUE:
            raise ValueError(f"cannot skew {name!r}; skewable: {', '.join(SKEWABLE)}")
        setattr(GpuState, name, _plus(TRUE[name], delta))
    try:
        yield
    finally:
        for name, _ in skews:
            setattr(GpuState, name, TRUE[name])


def _plus(method: Callable[..., Any], delta: float) -> Callable[..., Any]:
    """``method`` answering ``delta`` more, an integer where it answered one."""

    def skewed_method(self: GpuState, t: float) -> Any:
        got = method(self, t)
        return got + delta if isinstance(got, float) else round(got + delta)

    return skewed_method


def _na(ok: bool, text: Callable[[], object]) -> str:
    return str(text()) if ok else "[N/A]"


def _yes(n: int) -> str:
    return "Yes" if n else "No"


def _fields(drv: SimDriver, g: GpuState, t: float) -> dict[str, Callable[[], object]]:
    """Each query field of one GPU at sim time t, as nvidia-smi prints it (nounits)."""
    m, f = g.model, g.model.features
    total, reserved, free, used = g.memory()
    temp = TRUE["temperature_c"](g, t)
    util = TRUE["util"](g, t)
    sm = TRUE["sm_clock"](g, t)
    whole = not g.mig_enabled
    fab = g.fabric
    return {
        "uuid": lambda: g.uuid,
        "name": lambda: m.name,
        "pci.bus_id": lambda: g.spec.pci_bus_id,
        "serial": lambda: g.spec.serial,
        "driver_version": lambda: drv.fleet.driver_version,
        "vbios_version": lambda: m.vbios_version,
        "inforom.img": lambda: m.inforom_image_version,
        "utilization.gpu": lambda: _na(whole, lambda: round(util)),
        "utilization.memory": lambda: _na(
            whole, lambda: min(100, round(util * g.activity.mem_ratio))
        ),
        "utilization.encoder": lambda: _na(whole and f.encoder, lambda: round(g.activity.enc)),
        "utilization.decoder": lambda: _na(whole and f.decoder, lambda: round(g.activity.dec)),
        "memory.total": lambda: total // MiB,
        "memory.reserved": lambda: reserved // MiB,
        "memory.used": lambda: used // MiB,
        "memory.free": lambda: free // MiB,
        "temperature.gpu": lambda: temp,
        "temperature.memory": lambda: (
            temp + m.temperature["memory_offset"] if f.memory_temperature else "N/A"
        ),
        "power.draw": lambda: f"{TRUE['power_mw'](g, t) / 1000:.2f}",
        "power.draw.instant": lambda: f"{TRUE['power_mw'](g, t) / 1000:.2f}",
        "power.limit": lambda: f"{m.power['limit']:.2f}",
        "enforced.power.limit": lambda: f"{m.power['limit']:.2f}",
        "clocks.current.sm": lambda: sm,
        "clocks.current.memory": lambda: m.clocks["mem_max"],
        "clocks.current.video": lambda: round(m.clocks["video_max"] * sm / m.clocks["sm_max"]),
        "clocks.max.sm": lambda: m.clocks["sm_max"],
        "clocks.max.memory": lambda: m.clocks["mem_max"],
        "pcie.link.gen.current": lambda: m.pcie_generation,
        "pcie.link.width.current": lambda: m.pcie_width,
        "clocks_event_reasons.active": lambda: f"0x{g.clocks_event_reasons(t):016X}",
        "pstate": lambda: f"P{g.pstate(t)}",
        "fan.speed": lambda: _na(f.fan, lambda: TRUE["fan_percent"](g, t)),
        "ecc.errors.corrected.volatile.total": lambda: _na(f.ecc, lambda: g.ecc_volatile[0]),
        "ecc.errors.uncorrected.volatile.total": lambda: _na(f.ecc, lambda: g.ecc_volatile[1]),
        "ecc.errors.corrected.aggregate.total": lambda: _na(f.ecc, lambda: g.ecc_aggregate[0]),
        "ecc.errors.uncorrected.aggregate.total": lambda: _na(f.ecc, lambda: g.ecc_aggregate[1]),
        "retired_pages.single_bit_ecc.count": lambda: _na(
            f.page_retirement, lambda: sum(1 for p in g.retired_pages if p[2] == 0)
        ),
        "retired_pages.double_bit.count": lambda: _na(
            f.page_retirement, lambda: sum(1 for p in g.retired_pages if p[2] == 1)
        ),
        "retired_pages.pending": lambda: _na(f.page_retirement, lambda: _yes(g.retired_pending)),
        "remapped_rows.correctable": lambda: _na(f.row_remapping, lambda: g.remapped[0]),
        "remapped_rows.uncorrectable": lambda: _na(f.row_remapping, lambda: g.remapped[1]),
        "remapped_rows.pending": lambda: _na(f.row_remapping, lambda: _yes(g.remapped[2])),
        "remapped_rows.failure": lambda: _na(f.row_remapping, lambda: _yes(g.remapped[3])),
        "clocks_event_reasons_counters.sw_power_cap": lambda: g.power_violation_ns(t),
        "clocks_event_reasons_counters.sync_boost": lambda: 0,
        "mig.mode.current": lambda: _na(
            m.mig_capable, lambda: "Enabled" if g.mig_enabled else "Disabled"
        ),
        "fabric.state": lambda: _STATES[fab.state_code] if fab else "N/A",
        "fabric.status": lambda: (
            ("Success" if fab.status == "SUCCESS" else fab.status.replace("_", " ").title())
            if fab and fab.state == "completed"
            else "N/A"
        ),
        "fabric.cliqueId": lambda: fab.clique_id if fab else "N/A",
    }


def standin(drv: SimDriver) -> Run:
    """run(args, timeout) answering nvidia-smi's commands for the simulated node ``drv``."""

    def run(args: Sequence[str], timeout: float) -> str:
        args = list(args)
        with drv.lock:
            now = drv.now()
            if args and args[0].startswith("--query-gpu="):
                return _query(drv, args[0].split("=", 1)[1].split(","), now)
            if args[:2] == ["mig", "-lgi"]:
                return _lgi(drv, compute=False)
            if args[:2] == ["mig", "-lci"]:
                return _lgi(drv, compute=True)
            if args[:2] == ["mig", "-lgip"]:
                return _lgip(drv)
            if args[:3] == ["dmon", "-s", "t"]:
                return _dmon(drv, now)
        raise SmiError(f"the stand-in does not answer nvidia-smi {' '.join(args)}")

    return run


def _query(drv: SimDriver, fields: list[str], t: float) -> str:
    lines = []
    for g in drv.gpus:
        known = _fields(drv, g, t)
        cells = []
        for name in fields:
            if name == "index":
                cells.append(str(g.index))
            elif name in known:
                cells.append(str(known[name]()))
            else:
                raise SmiError(f'Field "{name}" is not a valid field to query.')
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


def _lgi(drv: SimDriver, compute: bool) -> str:
    rows = []
    for g in drv.gpus:
        for mig in sorted(g.migs, key=lambda m: m.gi):
            p = mig.spec.profile
            where = f"{mig.spec.start}:{p.memory_slices}"
            if compute:
                rows.append(
                    f"|  {g.index:2d}  {mig.gi:5d}   MIG {p.name:12s} 0  {mig.ci:5d}  {where} |"
                )
            else:
                rows.append(f"|  {g.index:2d}  MIG {p.name:12s} {p.id:4d} {mig.gi:6d}   {where} |")
    if not rows:
        raise SmiError("No MIG-enabled devices found.")
    return "+---+\n| instances |\n|===|\n" + "\n".join(rows) + "\n+---+\n"


def _lgip(drv: SimDriver) -> str:
    rows = []
    for g in drv.gpus:
        if not g.mig_enabled:
            continue
        for p in g.model.mig_profiles:
            mem = math.floor(p.memory_mib / 1024 * 100) / 100
            rows.append(
                f"|  {g.index:2d}  MIG {p.name:12s} {p.id:4d}     0/7   {mem:.2f}   No  {p.sm} |"
            )
    if not rows:
        raise SmiError("No MIG-enabled devices found.")
    return "\n".join(rows) + "\n"


def _dmon(drv: SimDriver, t: float) -> str:
    lines = ["# gpu   rxpci   txpci", "# Idx    MB/s    MB/s"]
    for g in drv.gpus:
        rx, tx = (g.pcie_rate(t, rx=r) / 1e6 for r in (True, False))
        lines.append(f"  {g.index:3d}  {rx:6.0f}  {tx:6.0f}")
    return "\n".join(lines) + "\n"
