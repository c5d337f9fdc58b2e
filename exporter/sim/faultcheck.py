"""How a fault mapping (fleet-file form, or an injected Fault) is checked and made a Fault.

The keys common to every kind (kind, at, gpu) are checked here; each kind checks
its own (exporter/sim/faultkinds.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from exporter.sim.faultkinds import KINDS, LayoutParser, ParseContext
from exporter.sim.faults import Fault
from exporter.sim.schema import Reader, join

# Keys each kind takes besides kind, at and gpu.
KIND_KEYS: dict[str, tuple[str, ...]] = {name: kind.keys for name, kind in KINDS.items()}


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
