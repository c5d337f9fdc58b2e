"""The field-support matrix: per GPU model and driver, which DCGM fields NVML answers.

A cell says what happened to the field on that model's GPUs during the run: ``yes``
(served), ``partly (CODE on k of n)`` (served on some GPUs, e.g. utilization is
NOT_SUPPORTED on MIG-enabled ones), or ``no (CODE)``, CODE being NVML's answer to the
field's source: NOT_SUPPORTED, FUNCTION_NOT_FOUND (the driver lacks the call), or
"no GPM" for profiling fields on GPUs without GPM. Sources are read from the NVML calls
the exporter made (tools/devicecheck/calls.py), not from the exporter's own bookkeeping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pynvml as N

from exporter.catalog.metricsfile import Catalog, parse
from exporter.nvml.devices import Device
from exporter.nvml.fields import FIELDS, Field, Scope, Source
from exporter.nvml.session import code_name
from exporter.snapshot import Snapshot
from tools.devicecheck.calls import Recorder, handle_key

READ = (Source.FIELD, Source.CALL, Source.LABEL, Source.GPM, Source.FABRIC)
MATRIX_FIELDS = tuple(name for name, f in FIELDS.items() if f.source in READ)
_FABRIC_CALLS = ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo")


def every_field() -> Catalog:
    """A metrics file enabling every field the exporter knows (labels as labels)."""
    rows = [f"{name}, {'label' if f.is_label else 'gauge'}, x" for name, f in FIELDS.items()]
    return parse("\n".join(rows) + "\n", "<every field>")


def _served(snaps: Sequence[Snapshot], dev: Device, field: Field) -> bool:
    if field.is_label:
        return any(k == field.name for k, _ in dev.labels)
    return any(field.name in s.values.get(dev.key, {}) for s in snaps)


def _failure(rec: Recorder, field: Field, keys: set[int]) -> Counter[int]:
    """NVML's answers (not SUCCESS) to the field's source on the devices ``keys``."""
    codes: Counter[int] = Counter()
    if field.source is Source.FIELD:
        for fid, _ in field.field_ids:
            codes.update(rec.field_codes_for(fid, keys))
    elif field.source is Source.FABRIC:
        for name in _FABRIC_CALLS:
            codes.update(rec.codes_for(name, keys))
    elif field.call is not None:
        call: Any = field.call
        while call is not None:
            codes.update(rec.codes_for(call.function, set() if call.system else keys))
            call = call.fallback
    codes.pop(N.NVML_SUCCESS, None)
    codes.pop(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, None)  # a struct version probe
    return codes


def _reason(rec: Recorder, field: Field, keys: set[int]) -> str:
    if field.source is Source.GPM:
        return "no GPM"
    codes = _failure(rec, field, keys)
    if N.NVML_ERROR_FUNCTION_NOT_FOUND in codes and len(codes) > 1:
        codes.pop(N.NVML_ERROR_FUNCTION_NOT_FOUND)  # a fallback answered instead
    return code_name(codes.most_common(1)[0][0]) if codes else "not asked"


def _cell(rec: Recorder, field: Field, yes: int, no: list[set[int]], in_mig: int) -> str:
    if not no:
        return "yes"
    reason = _reason(rec, field, set().union(*no))
    n = len(no) + yes
    if in_mig == len(no) and reason == "NOT_SUPPORTED" and field.scope is Scope.DEVICE:
        if not yes:  # every GPU of the model is in MIG mode: what it does outside is unknown
            return "unknown outside MIG mode (NOT_SUPPORTED in MIG mode)"
        return f"yes, not in MIG mode (NOT_SUPPORTED on the {in_mig} of {n} in MIG mode)"
    return f"partly ({reason} on {len(no)} of {n})" if yes else f"no ({reason})"


def matrix(snaps: Sequence[Snapshot], rec: Recorder) -> dict[str, dict[str, str]]:
    """{model name: {DCGM field: cell}} for the GPUs of the last snapshot."""
    last = snaps[-1]
    by_model: dict[str, list[Device]] = {}
    for gpu in last.gpus:
        by_model.setdefault(gpu.model, []).append(gpu)
    out: dict[str, dict[str, str]] = {}
    for model, gpus in by_model.items():
        cells = {}
        for name in MATRIX_FIELDS:
            field = FIELDS[name]
            yes, no, in_mig = 0, [], 0
            for gpu in gpus:
                devs = [gpu, *(e for e in last.entities if e.parent is gpu)]
                if any(_served(snaps, d, field) for d in devs):
                    yes += 1
                else:
                    no.append({handle_key(d.handle) for d in devs})
                    in_mig += len(devs) > 1
            cells[name] = _cell(rec, field, yes, no, in_mig)
        out[model] = cells
    return out
