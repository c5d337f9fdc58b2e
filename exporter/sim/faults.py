"""Faults: what can go wrong on a simulated node, when, and how a fault is checked.

The kinds themselves (their keys, checks and effects) are classes in
exporter/sim/faultkinds.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.sim.faultkinds import KERNEL_LOG_ONLY, KINDS, LayoutParser, ParseContext
from exporter.sim.schema import Reader, join

__all__ = ["KERNEL_LOG_ONLY", "KIND_KEYS", "Fault", "LayoutParser", "parse_fault"]

# Keys each kind takes besides kind, at and gpu.
KIND_KEYS: dict[str, tuple[str, ...]] = {name: kind.keys for name, kind in KINDS.items()}


@dataclass(frozen=True)
class Fault:
    """One fault, at sim time `at` seconds (None: now when injected, 0 in a fleet file).

    kind: lost | not_supported | xid | slow | driver_unloaded | driver_upgrade |
    mig_reconfigure | ecc_dbe | overheat | fabric. `gpu` is the GPU index (all GPUs when
    None, for not_supported, slow and fabric). See docs/simulator.md for what each kind does.
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
    fabric: Any = None  # a fabric fault's change (exporter/sim/fabricspec.py)
    version: str | None = None
    reload: bool = True

    def as_raw(self) -> dict[str, Any]:
        """The fault as a fleet-file mapping (only the keys that were set)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if getattr(self, f.name) != f.default}


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
    name = reader.string(kind_raw, join(path, "kind"))
    kind = KINDS.get(name)
    if kind is None:
        reader.fail(join(path, "kind"), f"unknown fault kind '{name}'; known: {', '.join(KINDS)}")
    allowed = ("kind", "at", "gpu", *kind.keys)
    for key in raw:
        if key not in allowed:
            reader.fail(
                join(path, key), f"does not apply to {name} faults; they take {', '.join(allowed)}"
            )
    at = raw.get("at")
    at = None if at is None else reader.number(at, join(path, "at"), lo=0)
    gpu = _gpu(reader, raw, path, name, kind.gpu, len(gpu_models))
    ctx = ParseContext(
        reader=reader,
        raw=raw,
        path=path,
        kind=name,
        gpu=gpu,
        model=gpu_models[gpu] if gpu is not None else None,
        function_names=function_names,
        parse_layout=parse_layout,
    )
    return Fault(kind=name, at=at, gpu=gpu, **kind.parse(ctx))


def _gpu(reader: Reader, raw: Any, path: str, kind: str, rule: str, gpus: int) -> int | None:
    """The fault's GPU index, checked against the node and the kind's rule."""
    value = raw.get("gpu")
    gpu = None if value is None else reader.integer(value, join(path, "gpu"), lo=0)
    if gpu is not None and gpu >= gpus:
        reader.fail(join(path, "gpu"), f"no GPU {gpu}; the node has {gpus} (0-{gpus - 1})")
    if gpu is None and rule == "required":
        reader.fail(path, f"{kind} faults need 'gpu' (the GPU index)")
    if gpu is not None and rule == "forbidden":
        reader.fail(join(path, "gpu"), f"{kind} affects the whole node; remove 'gpu'")
    return gpu


def _all_keys() -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for keys in KIND_KEYS.values() for k in keys))
