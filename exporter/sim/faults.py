"""Faults: what can go wrong on a simulated node, when, and how a fault is checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.sim.schema import Reader, join

# Keys each kind takes besides kind, at and gpu.
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "lost": (),
    "not_supported": ("function", "field"),
    "xid": ("xid", "gi", "count"),
    "slow": ("function", "seconds", "duration"),
    "driver_unloaded": ("duration", "code"),
    "mig_reconfigure": ("mig",),
    "ecc_dbe": ("count",),
    "overheat": ("temp_c", "duration"),
}
_GPU_REQUIRED = {"lost", "xid", "mig_reconfigure", "ecc_dbe", "overheat"}
# What a driver_unloaded fault's calls return: the module unloaded, user space and kernel
# module from different driver versions (mid-upgrade), NVML shut down under the caller.
DRIVER_CODES = ("DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "UNINITIALIZED")


@dataclass(frozen=True)
class Fault:
    """One fault, at sim time `at` seconds (None: now when injected, 0 in a fleet file).

    kind: lost | not_supported | xid | slow | driver_unloaded | mig_reconfigure |
    ecc_dbe | overheat. `gpu` is the GPU index (all GPUs when None, for
    not_supported and slow). See docs/simulator.md for what each kind does.
    """

    kind: str
    gpu: int | None = None
    at: float | None = None
    xid: int | None = None
    gi: int | None = None
    count: int = 1
    function: str | None = None
    field: int | None = None
    seconds: float | None = None
    duration: float | None = None
    temp_c: float | None = None
    mig: Any = None
    code: str | None = None

    def as_raw(self) -> dict[str, Any]:
        """The fault as a fleet-file mapping (only the keys that were set)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if getattr(self, f.name) != f.default}


LayoutParser = Callable[[Any, str, int], Any]


def parse_fault(
    reader: Reader,
    raw: Any,
    path: str,
    gpu_models: Sequence[Any],
    parse_layout: LayoutParser,
    function_names: Collection[str],
) -> Fault:
    """Check one fault mapping (fleet-file form) and return it as a Fault.

    gpu_models: the model of each GPU of the node, by index. parse_layout turns
    a `mig:` value into the resolved layout for a GPU index.
    """
    kind_raw = reader.mapping(raw, path, ("kind", "at", "gpu", *_all_keys()), ("kind",))["kind"]
    kind = reader.string(kind_raw, join(path, "kind"))
    if kind not in KIND_KEYS:
        reader.fail(
            join(path, "kind"), f"unknown fault kind '{kind}'; known: {', '.join(KIND_KEYS)}"
        )
    allowed = ("kind", "at", "gpu", *KIND_KEYS[kind])
    for key in raw:
        if key not in allowed:
            reader.fail(
                join(path, key), f"does not apply to {kind} faults; they take {', '.join(allowed)}"
            )

    def get(key: str, conv: Callable[..., Any], **bounds: Any) -> Any:
        value = raw.get(key)
        return None if value is None else conv(value, join(path, key), **bounds)

    values: dict[str, Any] = {"kind": kind, "at": get("at", reader.number, lo=0)}
    gpu = get("gpu", reader.integer, lo=0)
    if gpu is not None and gpu >= len(gpu_models):
        reader.fail(
            join(path, "gpu"),
            f"no GPU {gpu}; the node has {len(gpu_models)} (0-{len(gpu_models) - 1})",
        )
    if gpu is None and kind in _GPU_REQUIRED:
        reader.fail(path, f"{kind} faults need 'gpu' (the GPU index)")
    if kind == "driver_unloaded" and gpu is not None:
        reader.fail(join(path, "gpu"), "driver_unloaded affects the whole node; remove 'gpu'")
    values["gpu"] = gpu
    model = gpu_models[gpu] if gpu is not None else None

    if kind in ("not_supported", "slow"):
        function = get("function", reader.string)
        if function is not None and function not in function_names:
            reader.fail(
                join(path, "function"),
                f"'{function}' is not an NVML function the simulator implements"
                " (names are C names such as nvmlDeviceGetPowerUsage)",
            )
        values["function"] = function
    if kind == "not_supported":
        values["field"] = get("field", reader.integer, lo=0)
        if (values["function"] is None) == (values["field"] is None):
            reader.fail(path, "not_supported faults need exactly one of 'function' or 'field'")
    elif kind == "slow":
        if values["function"] is None:
            reader.fail(path, "slow faults need 'function' (the NVML C function name)")
        values["seconds"] = get("seconds", reader.number, lo=0)
        if values["seconds"] is None:
            reader.fail(path, "slow faults need 'seconds' (blocking time per call)")
        values["duration"] = get("duration", reader.number, lo=0)
    elif kind == "xid":
        values["xid"] = get("xid", reader.integer, lo=1)
        if values["xid"] is None:
            reader.fail(path, "xid faults need 'xid' (the XID number, e.g. 79)")
        values["gi"] = get("gi", reader.integer, lo=0, hi=14)
        if values["gi"] is not None and not model.mig_capable:
            reader.fail(join(path, "gi"), f"{model.name} has no MIG; remove 'gi'")
        values["count"] = get("count", reader.integer, lo=1) or 1
    elif kind == "driver_unloaded":
        values["duration"] = get("duration", reader.number, lo=0)
        if values["duration"] is None:
            reader.fail(path, "driver_unloaded faults need 'duration' (seconds until it is back)")
        values["code"] = get("code", reader.string)
        if values["code"] not in (None, *DRIVER_CODES):
            reader.fail(join(path, "code"), f"use one of {', '.join(DRIVER_CODES)}")
    elif kind == "mig_reconfigure":
        if "mig" not in raw:
            reader.fail(path, "mig_reconfigure faults need 'mig' (the new layout, or false)")
        if not model.mig_capable:
            reader.fail(join(path, "gpu"), f"{model.name} has no MIG")
        values["mig"] = parse_layout(raw["mig"], join(path, "mig"), gpu)
    elif kind == "ecc_dbe":
        if not model.features.ecc:
            reader.fail(join(path, "gpu"), f"{model.name} has no ECC")
        values["count"] = get("count", reader.integer, lo=1) or 1
    elif kind == "overheat":
        values["temp_c"] = get("temp_c", reader.number, lo=0, hi=150)
        if values["temp_c"] is None:
            reader.fail(path, "overheat faults need 'temp_c' (the temperature held)")
        values["duration"] = get("duration", reader.number, lo=0)
    return Fault(**values)


def _all_keys() -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for keys in KIND_KEYS.values() for k in keys))
