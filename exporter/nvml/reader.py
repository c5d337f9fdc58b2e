"""Reads the enabled batch-field and call-backed fields of one device per cycle.

Per device, the fields that have an NVML field id go into one
``nvmlDeviceGetFieldValues`` call, and fields that share a driver call (GPU_UTIL
and MEM_COPY_UTIL, the four framebuffer fields) share one call. A field the
device cannot serve is logged once and never asked for again on that device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import Call, Field, Scope, Source
from exporter.nvml.session import Session, Unavailable

log = logging.getLogger(__name__)

Value = int | float
_READ = {
    N.NVML_VALUE_TYPE_DOUBLE: "dVal",
    N.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    N.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    N.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    N.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class _Plan:
    """What to ask one device for: the batch ids and the calls, minus what it lacks."""

    __slots__ = ("batch", "calls", "ids")

    def __init__(self, fields: Iterable[Field]) -> None:
        self.batch: list[Field] = []
        self.calls: dict[Call, list[Field]] = {}
        for f in fields:
            if f.source is Source.FIELD:
                self.batch.append(f)
            elif f.source is Source.CALL and f.call is not None:
                self.calls.setdefault(f.call, []).append(f)
        self.ids = [fid for f in self.batch for fid in f.field_ids]


class FieldReader:
    """Reads batch and call fields; remembers, per device, what it does not support."""

    def __init__(self, session: Session, fields: Iterable[Field]) -> None:
        self.session = session
        self._plans: dict[tuple[str, Scope], _Plan] = {}
        self._off: dict[str, set[str]] = {}
        self._told = False  # the one info line about unavailable fields was logged
        self.set_fields(fields)

    def set_fields(self, fields: Iterable[Field]) -> None:
        """Read these fields from now on; what devices lack stays known."""
        fields = [f for f in fields if f.source in (Source.FIELD, Source.CALL)]
        self.device_fields = [f for f in fields if f.scope is Scope.DEVICE]
        self.instance_fields = [f for f in fields if f.scope is Scope.INSTANCE]
        self._plans.clear()

    def forget(self, keys: Iterable[str]) -> None:
        """Drop plans of devices that went away (a new MIG layout, a re-initialised driver)."""
        for key in keys:
            self._off.pop(key, None)
            for scope in Scope:
                self._plans.pop((key, scope), None)

    def read(self, dev: Device, scope: Scope) -> dict[str, Value]:
        """Read this device's fields of ``scope``; DeviceLost/DriverGone propagate."""
        plan = self._plans.get((dev.key, scope))
        if plan is None:
            off = self._off.get(dev.key, set())
            fields = self.device_fields if scope is Scope.DEVICE else self.instance_fields
            plan = _Plan(f for f in fields if f.name not in off)
            self._plans[(dev.key, scope)] = plan
        out: dict[str, Value] = {}
        if plan.ids:
            self._batch(dev, plan, out)
        for call, fields in plan.calls.items():
            try:
                raw = self.session.call(call, dev.handle)
            except Unavailable as e:
                self._disable(dev, fields, str(e))
                continue
            except RuntimeError:
                continue  # counted by the session; try again next cycle
            for f in fields:
                try:
                    out[f.name] = f.convert(f.pick(raw) if f.pick else raw)
                except (AttributeError, TypeError, IndexError) as e:
                    self._disable(dev, [f], f"unexpected result: {e}")
        return out

    def _batch(self, dev: Device, plan: _Plan, out: dict[str, Value]) -> None:
        try:
            values = N.nvmlDeviceGetFieldValues(dev.handle, plan.ids)
        except N.NVMLError as e:
            err = self.session.failure("nvmlDeviceGetFieldValues", e)
            if isinstance(err, Unavailable):
                self._disable(dev, plan.batch, str(err))
                return
            if isinstance(err, RuntimeError):
                return
            raise err from None
        i = 0
        lacking: list[tuple[Field, str]] = []
        for f in plan.batch:
            total: Value | None = 0
            for _ in f.field_ids:
                v = values[i]
                i += 1
                if v.nvmlReturn != N.NVML_SUCCESS:
                    if v.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED:
                        lacking.append((f, f"field {v.fieldId}: NOT_SUPPORTED"))
                    else:
                        self.session.count("nvmlDeviceGetFieldValues", v.nvmlReturn)
                    total = None
                elif total is not None:
                    total += _value(v, f)
            if total is not None:
                out[f.name] = f.convert(total)
        for f, why in lacking:
            self._disable(dev, [f], why)

    def _disable(self, dev: Device, fields: list[Field], why: str) -> None:
        off = self._off.setdefault(dev.key, set())
        for f in fields:
            if f.name not in off:
                off.add(f.name)
                log.debug("%s not available on %s: %s; omitted", f.name, _where(dev), why)
                if not self._told:  # one line at the default level, not one per field and GPU
                    self._told = True
                    log.info(
                        "fields a GPU does not support are omitted for it (first: %s on %s); "
                        "--log-level debug names each",
                        f.name,
                        _where(dev),
                    )
        for s in Scope:
            self._plans.pop((dev.key, s), None)


def _value(v: Any, f: Field) -> Value:
    attr = _READ.get(v.valueType, "ullVal")
    if attr == "dVal" and f.integer:
        attr = "ullVal"  # some drivers leave valueType unset (0) on integer fields such as ECC
    return getattr(v.value, attr)


def _where(dev: Device) -> str:
    if dev.is_mig:
        return f"GPU {dev.index} MIG instance {dev.gi} ({dev.profile})"
    return f"GPU {dev.index} ({dev.uuid})"
