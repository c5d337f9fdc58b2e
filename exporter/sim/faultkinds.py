"""One class per fault kind: which keys it takes, how they are checked, what it does.

Each kind parses its own keys of a fleet-file fault mapping (`parse`, called
by faultcheck.parse_fault after the common keys kind, at and gpu are checked)
and applies a due fault to the running driver (`apply`, called with the
driver lock held). See docs/simulator.md for what each kind does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import pynvml

from exporter.sim import fabricspec, kmsg
from exporter.sim.schema import Reader, join

if TYPE_CHECKING:
    from exporter.sim.devices import GpuState
    from exporter.sim.driverview import DriverView
    from exporter.sim.faults import Fault

# XIDs the driver reports in the kernel log but not through NVML events: DCGM 4.x reads
# exactly these from /dev/kmsg (a GPU off the bus, GSP timeouts and errors).
KERNEL_LOG_ONLY = frozenset({79, 119, 120})
_XID_TEXT = {
    79: "GPU has fallen off the bus.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    120: "GSP task timeout @ pc:0x0, task: 1",
}

LayoutParser = Callable[[Any, str, int], Any]


@dataclass(frozen=True)
class ParseContext:
    """One fault mapping being checked: its reader, raw keys, path and GPU."""

    reader: Reader
    raw: Mapping[str, Any]
    path: str
    kind: str
    gpu: int | None
    model: Any  # the GPU's model (None for a node-wide fault)
    function_names: Collection[str]
    parse_layout: LayoutParser

    def get(self, key: str, conv: Callable[..., Any], **bounds: Any) -> Any:
        """The key's value converted by `conv` (a Reader method), or None when absent."""
        value = self.raw.get(key)
        return None if value is None else conv(value, join(self.path, key), **bounds)

    def need(self, key: str, what: str, conv: Callable[..., Any], **bounds: Any) -> Any:
        """Like get(), but a missing key fails naming what it is for."""
        value = self.get(key, conv, **bounds)
        if value is None:
            self.reader.fail(self.path, f"{self.kind} faults need '{key}' ({what})")
        return value

    def fail(self, key: str | None, message: str) -> NoReturn:
        """Fail at the fault (key None) or at one of its keys."""
        self.reader.fail(self.path if key is None else join(self.path, key), message)

    def function(self) -> str | None:
        """The optional `function` key, checked against the implemented C functions."""
        function = self.get("function", self.reader.string)
        if function is not None and function not in self.function_names:
            self.fail(
                "function",
                f"'{function}' is not an NVML function the simulator implements"
                " (names are C names such as nvmlDeviceGetPowerUsage)",
            )
        return function


class FaultKind:
    """A kind of fault. `gpu`: 'required', 'optional' (all GPUs) or 'forbidden' (node-wide)."""

    name: ClassVar[str]
    keys: ClassVar[tuple[str, ...]] = ()
    gpu: ClassVar[str] = "required"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        """The kind's own Fault fields from the mapping (fails on a bad value)."""
        return {}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        """Make the fault happen (driver lock held)."""
        raise NotImplementedError


def _at(f: Fault) -> float:
    """When a due fault happens (the driver sets `at` on injection)."""
    assert f.at is not None, "a due fault has its time"
    return f.at


def _end(f: Fault) -> float:
    return math.inf if f.duration is None else _at(f) + f.duration


def _need(value: Any, key: str) -> Any:
    """A key that parse() made required for this kind."""
    assert value is not None, f"parse() requires '{key}'"
    return value


class Lost(FaultKind):
    name = "lost"

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        assert gpu is not None
        gpu.lost = True


class NotSupported(FaultKind):
    name = "not_supported"
    keys = ("function", "field")
    gpu = "optional"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        function = ctx.function()
        field = ctx.get("field", ctx.reader.integer, lo=0)
        if (function is None) == (field is None):
            ctx.fail(None, "not_supported faults need exactly one of 'function' or 'field'")
        return {"function": function, "field": field}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        if gpu is None and f.function is not None:
            driver.unsupported_functions.add(f.function)
        for g in [gpu] if gpu is not None else driver.gpus:
            if f.function is not None:
                g.unsupported_functions.add(f.function)
            else:
                g.unsupported_fields.add(_need(f.field, "field"))


class Slow(FaultKind):
    name = "slow"
    keys = ("function", "seconds", "duration")
    gpu = "optional"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        function = ctx.function()
        if function is None:
            ctx.fail(None, "slow faults need 'function' (the NVML C function name)")
        return {
            "function": function,
            "seconds": ctx.need("seconds", "blocking time per call", ctx.reader.number, lo=0),
            "duration": ctx.get("duration", ctx.reader.number, lo=0),
        }

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        assert f.function is not None
        rule = (f.gpu, _need(f.seconds, "seconds"), _at(f), _end(f))
        driver.slow_rules.setdefault(f.function, []).append(rule)


class DriverUnloaded(FaultKind):
    """rmmod, and modprobe of the same driver ``duration`` s later. Linux refuses to unload
    a module in use: while NVML is initialised the unload waits for its last client."""

    name = "driver_unloaded"
    keys = ("duration",)
    gpu = "forbidden"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        duration = ctx.need("duration", "seconds until it is back", ctx.reader.number, lo=0)
        return {"duration": duration}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        driver.unload(_at(f), _need(f.duration, "duration"))


class DriverUpgrade(FaultKind):
    """A new driver installed: its library replaces the old one on disk at once (processes
    started from now on load it); with ``reload`` (default) the module is then unloaded
    once NVML's clients let go, and the new one loaded ``duration`` s later. Until a
    process restarts, its library stays the old one."""

    name = "driver_upgrade"
    keys = ("version", "duration", "reload")
    gpu = "forbidden"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        r = ctx.reader
        version = ctx.need("version", "the new driver version", r.string)
        reload = ctx.get("reload", r.boolean)
        return {
            "version": version,
            "duration": ctx.get("duration", r.number, lo=0) or 0.0,
            "reload": True if reload is None else reload,
        }

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        driver.module.installed = _need(f.version, "version")
        if f.reload:
            driver.unload(_at(f), f.duration or 0.0)


class Xid(FaultKind):
    name = "xid"
    keys = ("xid", "gi", "count")

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        r = ctx.reader
        xid = ctx.need("xid", "the XID number, e.g. 79", r.integer, lo=1)
        gi = ctx.get("gi", r.integer, lo=0, hi=14)
        if gi is not None and not ctx.model.mig_capable:
            ctx.fail("gi", f"{ctx.model.name} has no MIG; remove 'gi'")
        return {"xid": xid, "gi": gi, "count": ctx.get("count", r.integer, lo=1) or 1}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        """The driver logs every XID to the kernel log; NVML events carry all but
        KERNEL_LOG_ONLY, and one naming a MIG instance reaches only callers allowed to
        watch MIG instances (nvmlEventSetWait_v2: without the privilege, only events
        that affect the whole device are reported)."""
        assert gpu is not None
        xid = _need(f.xid, "xid")
        ci = None
        if f.gi is not None:
            mig = gpu.mig_by_gi(f.gi)
            ci = mig.ci if mig is not None else 0
        if driver.kernel_log is not None:
            detail = _XID_TEXT.get(xid, "Graphics Exception")
            text = kmsg.xid_text(gpu.spec.pci_bus_id, xid, detail, gi=f.gi, ci=ci)
            for _ in range(f.count):
                driver.kernel_log.write(text)
        if xid in KERNEL_LOG_ONLY or (f.gi is not None and not driver.fleet.mig_monitor):
            return
        kind = pynvml.nvmlEventTypeXidCriticalError
        for _ in range(f.count):
            driver.events.publish(gpu, kind, xid, _at(f), f.gi, ci)


class MigReconfigure(FaultKind):
    name = "mig_reconfigure"
    keys = ("mig",)

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        if "mig" not in ctx.raw:
            ctx.fail(None, "mig_reconfigure faults need 'mig' (the new layout, or false)")
        if not ctx.model.mig_capable:
            ctx.fail("gpu", f"{ctx.model.name} has no MIG")
        gpu = _need(ctx.gpu, "gpu")
        return {"mig": ctx.parse_layout(ctx.raw["mig"], join(ctx.path, "mig"), gpu)}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        assert gpu is not None
        for m in gpu.reconfigure(f.mig):
            driver.handles.pop(m.key, None)  # unknown handles: INVALID_ARGUMENT, as stale ones
        for m in gpu.migs:
            driver.register(m)
        driver.events.publish(gpu, pynvml.nvmlEventMigConfigChange, 0, _at(f))


class EccDbe(FaultKind):
    name = "ecc_dbe"
    keys = ("count",)

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        if not ctx.model.features.ecc:
            ctx.fail("gpu", f"{ctx.model.name} has no ECC")
        return {"count": ctx.get("count", ctx.reader.integer, lo=1) or 1}

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        assert gpu is not None
        at = _at(f)
        gpu.ecc_volatile[1] += f.count
        gpu.ecc_aggregate[1] += f.count
        if gpu.model.features.row_remapping:
            gpu.remapped[1] += f.count
            gpu.remapped[2] = 1
        if gpu.model.features.page_retirement:
            cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            for _ in range(f.count):
                address = 0x1F0000 + 0x1000 * (len(gpu.retired_pages) + 17 * gpu.index)
                gpu.retired_pages.append((address, driver.epoch_us(at), cause))
            gpu.retired_pending = 1
        driver.events.publish(gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0, at)


class Overheat(FaultKind):
    name = "overheat"
    keys = ("temp_c", "duration")

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        r = ctx.reader
        return {
            "temp_c": ctx.need("temp_c", "the temperature held", r.number, lo=0, hi=150),
            "duration": ctx.get("duration", r.number, lo=0),
        }

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        assert gpu is not None
        gpu.overheats.append((_at(f), _end(f), _need(f.temp_c, "temp_c")))


class Fabric(FaultKind):
    """The NVLink fabric of a GPU (all fabric GPUs when `gpu` is left out) changes."""

    name = "fabric"
    keys = ("fabric",)
    gpu = "optional"

    def parse(self, ctx: ParseContext) -> dict[str, Any]:
        if "fabric" not in ctx.raw:
            ctx.fail(None, "fabric faults need 'fabric' (state, status, health, ... to change)")
        if ctx.model is not None and not ctx.model.features.fabric:
            ctx.fail("gpu", f"{ctx.model.name} does not register with an NVLink fabric")
        return {
            "fabric": fabricspec.parse_change(
                ctx.reader, ctx.raw["fabric"], join(ctx.path, "fabric")
            )
        }

    def apply(self, driver: DriverView, f: Fault, gpu: GpuState | None) -> None:
        for g in [gpu] if gpu is not None else driver.gpus:
            if g.fabric is not None:
                g.fabric = f.fabric.over(g.fabric)


KINDS: dict[str, FaultKind] = {
    k.name: k()
    for k in (
        Lost,
        NotSupported,
        Xid,
        Slow,
        DriverUnloaded,
        DriverUpgrade,
        MigReconfigure,
        EccDbe,
        Overheat,
        Fabric,
    )
}
