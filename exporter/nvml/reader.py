"""Reads the enabled batch-field and call-backed fields of one device per cycle.

Per device, the fields that have an NVML field id go into one
``nvmlDeviceGetFieldValues`` call, and fields that share a driver call (GPU_UTIL
and MEM_COPY_UTIL, the four framebuffer fields) share one call. A field the
device cannot serve (NOT_SUPPORTED, or INVALID_ARGUMENT for a field id its driver
does not know) is read its fallback way from then on where it has one, else logged
once and not asked for again on that device, until :meth:`FieldReader.recheck`
(its MIG mode changed). An ECC entry NVML left untouched (NVIDIA bug 2009232, ECC
off: timestamp and latency 0) is NOT_SUPPORTED, as DCGM takes it.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import Call, Field, Scope, Source
from exporter.nvml.rates import Sample, counter_rate
from exporter.nvml.session import CallFailed, NvmlProblem, Session, Unavailable, code_name

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


def _layout() -> str:
    """struct format of one c_nvmlFieldValue_t: fieldId, timestamp, latencyUsec, valueType,
    nvmlReturn and the value's 8 bytes as an unsigned integer, the rest skipped."""
    t = N.c_nvmlFieldValue_t
    out, at = "", 0
    for name, code in (
        ("fieldId", "I"),
        ("timestamp", "q"),
        ("latencyUsec", "q"),
        ("valueType", "I"),
        ("nvmlReturn", "I"),
        ("value", "Q"),
    ):
        f = getattr(t, name)
        out += f"{f.offset - at}x{code}" if f.offset > at else code
        at = f.offset + f.size
    return out + (f"{ctypes.sizeof(t) - at}x" if ctypes.sizeof(t) > at else "")


_ENTRY = _layout()
_AT, _SIZE = N.c_nvmlFieldValue_t.value.offset, ctypes.sizeof(N.c_nvmlFieldValue_t)
_AS_DOUBLE = f"{_AT}xd{_SIZE - _AT - 8}x"  # an entry's value as the union's dVal
# The union's members as pynvml declares them (ulVal, ullVal: c_ulong; sllVal: c_long)
_BITS = {
    name: 8 * ctypes.sizeof(dict(N.c_nvmlValue_t._fields_)[name])
    for name in ("uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
}
_SIGNED = frozenset({"sllVal", "siVal"})
_INTEGER = {**_READ, N.NVML_VALUE_TYPE_DOUBLE: "ullVal"}  # integer member per value type
# value types whose member is the 8 bytes as an unsigned integer, as unpacked
_AS_IS = frozenset(k for k, a in _READ.items() if _BITS.get(a) == 64 and a not in _SIGNED)
_LACKING = frozenset({N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT})
_ECC_IDS = range(1, 32)  # ECC and retired-page field ids, which ECC off can leave unset
_UNSET = "left unset (ECC is off)"


class _Request:
    """The arguments of one device's ``nvmlDeviceGetFieldValues``, built once per plan.

    pynvml's wrapper builds the array and sets each (fieldId, scopeId) through
    its structure wrapper on every call; here the array is filled once, and
    copied back to that state before each call, so NVML sees what pynvml's
    fresh array would hold. The answer is unpacked in one go (``entries``).
    """

    __slots__ = ("args", "blank", "doubles", "entries", "values")

    def __init__(self, ids: Sequence[tuple[int, int]]) -> None:
        values = (N.c_nvmlFieldValue_t * len(ids))()
        for entry, (fid, scope) in zip(values, ids, strict=True):
            entry.fieldId, entry.scopeId = fid, scope
        self.values = values
        self.blank = bytes(values)
        self.args = (ctypes.c_int32(len(ids)), ctypes.byref(values))
        # (fieldId, timestamp, valueType, nvmlReturn, value bits) of each entry
        self.entries = struct.Struct("=" + _ENTRY * len(ids))
        self.doubles = struct.Struct("=" + _AS_DOUBLE * len(ids))  # each value as dVal

    def reset(self) -> Any:
        """The array, as first built (NVML overwrites it)."""
        ctypes.memmove(self.values, self.blank, len(self.blank))
        return self.values


class _Plan:
    """What to ask one device for: the batch ids and the calls, minus what it lacks."""

    __slots__ = ("batch", "calls", "ids", "request")

    def __init__(self, fields: Iterable[Field]) -> None:
        self.batch: list[Field] = []
        self.calls: dict[Call, list[Field]] = {}
        for f in fields:
            if f.source is Source.FIELD:
                self.batch.append(f)
            elif f.source is Source.CALL and f.call is not None:
                self.calls.setdefault(f.call, []).append(f)
        self.ids = [fid for f in self.batch for fid in f.field_ids]
        self.request = _Request(self.ids) if self.ids else None


class FieldReader:
    """Reads batch and call fields; remembers, per device, what it does not support."""

    def __init__(self, session: Session, fields: Iterable[Field]) -> None:
        self.session = session
        self._plans: dict[tuple[str, Scope], _Plan] = {}
        self._off: dict[str, set[str]] = {}
        self._alt: dict[str, dict[str, Field]] = {}  # device key -> field name -> fallback
        self._prev: dict[tuple[str, str], Sample] = {}  # (device key, field) -> last counter
        self._static: dict[tuple[str, Call], Any] = {}  # (device key, static call) -> answer
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
            self.recheck(key)
            for name in [n for k, n in self._prev if k == key]:
                del self._prev[(key, name)]
            for call in [c for k, c in self._static if k == key]:
                del self._static[(key, call)]

    def recheck(self, key: str) -> None:
        """Ask the device for every field again: what it lacked may have been its mode
        (utilization is NOT_SUPPORTED only while MIG is on)."""
        self._off.pop(key, None)
        self._alt.pop(key, None)
        for scope in Scope:
            self._plans.pop((key, scope), None)

    def _fields(self, dev: Device, fields: Iterable[Field]) -> list[Field]:
        """``fields`` as read on ``dev``: what it lacks left out, fallbacks in place."""
        off = self._off.get(dev.key, ())
        alt = self._alt.get(dev.key, {})
        return [alt.get(f.name, f) for f in fields if f.name not in off]

    def prime(self, devs: Sequence[Device]) -> bool:
        """Read a first sample of the rate fields of devices that have none; True if any.

        After a short wait the next :meth:`read` then has a rate for them.
        Errors are left to :meth:`read`, which meets them again.
        """
        taken = False
        for dev in devs:
            fields = [
                f
                for f in self._fields(dev, self.device_fields)
                if f.rate and f.source is Source.FIELD and (dev.key, f.name) not in self._prev
            ]
            ids = [fid for f in fields for fid in f.field_ids]
            if not ids:
                continue
            try:
                values = self.session.run("nvmlDeviceGetFieldValues", dev.handle, ids)
            except NvmlProblem:  # counted by the session
                continue
            i = 0
            for f in fields:
                got = values[i : i + len(f.field_ids)]
                i += len(f.field_ids)
                if all(v.nvmlReturn == N.NVML_SUCCESS for v in got):
                    total = sum(_value(v, f) for v in got)
                    stamp = got[0].timestamp
                    self._prev[(dev.key, f.name)] = Sample(
                        float(total), stamp / 1e6 if stamp else time.monotonic()
                    )
                    taken = True
        return taken

    def read(self, dev: Device, scope: Scope) -> dict[str, Value]:
        """Read this device's fields of ``scope``; DeviceLost/DriverGone propagate."""
        plan = self._plans.get((dev.key, scope))
        if plan is None:
            fields = self.device_fields if scope is Scope.DEVICE else self.instance_fields
            plan = _Plan(self._fields(dev, fields))
            self._plans[(dev.key, scope)] = plan
        out: dict[str, Value] = {}
        if plan.ids:
            self._batch(dev, plan, out)
        for call, fields in plan.calls.items():
            raw = self._static.get((dev.key, call)) if call.static else None
            if raw is None:
                try:
                    raw = self.session.call(call, dev.handle)
                except Unavailable as e:
                    self._disable(dev, fields, str(e))
                    continue
                except CallFailed:
                    continue  # counted by the session; try again next cycle
                if call.static:
                    self._static[(dev.key, call)] = raw
            for f in fields:
                try:
                    out[f.name] = f.convert(f.pick(raw) if f.pick else raw)
                except (AttributeError, TypeError, IndexError) as e:
                    self._disable(dev, [f], f"unexpected result: {e}")
        return out

    def _batch(self, dev: Device, plan: _Plan, out: dict[str, Value]) -> None:
        req = plan.request
        assert req is not None
        req.reset()
        try:
            self.session.c_call("nvmlDeviceGetFieldValues", dev.handle, *req.args)
        except Unavailable as err:
            self._disable(dev, plan.batch, str(err))
            return
        except CallFailed:
            return  # counted by the session; try again next cycle
        answer = _Answer(req)
        lacking: list[tuple[Field, str]] = []
        for f in plan.batch:
            total: Value | None = 0
            stamp_us = 0
            for _ in f.field_ids:
                fid, stamp, ret, value = answer.next(f.integer)
                stamp_us = stamp_us or stamp
                if ret != N.NVML_SUCCESS:
                    if ret in _LACKING:
                        lacking.append((f, f"field {fid}: {code_name(ret)}"))
                    else:
                        self.session.count("nvmlDeviceGetFieldValues", ret)
                    total = None
                elif fid in _ECC_IDS and answer.unset():
                    lacking.append((f, f"field {fid}: {_UNSET}"))
                    total = None
                elif total is not None:
                    total += value
            if total is not None and f.rate:
                self._rate(dev, f, total, stamp_us, out)
            elif total is not None:
                out[f.name] = f.convert(total)
        for f, why in lacking:
            self._disable(dev, [f], why)

    def _rate(self, dev: Device, f: Field, total: Value, stamp_us: int, out: dict) -> None:
        """Publish a counter's rate against its previous sample (nothing on the first)."""
        now = Sample(float(total), stamp_us / 1e6 if stamp_us else time.monotonic())
        key = (dev.key, f.name)
        r = counter_rate(self._prev.get(key), now, f.rate)
        self._prev[key] = now
        if r is not None:
            out[f.name] = f.convert(r)

    def _disable(self, dev: Device, fields: list[Field], why: str) -> None:
        """Read ``fields`` their fallback way on ``dev`` from now on, or not at all."""
        off = self._off.setdefault(dev.key, set())
        alt = self._alt.setdefault(dev.key, {})
        for f in fields:
            if f.fallback is not None and f.name not in alt:
                alt[f.name] = f.fallback
                log.debug("%s on %s: %s; read another way", f.name, _where(dev), why)
            elif f.name not in off:
                off.add(f.name)
                self.session.unsupported_field(f.name, _where(dev), why)
        for s in Scope:
            self._plans.pop((dev.key, s), None)


def _value(v: Any, f: Field) -> Value:
    get = object.__getattribute__  # numeric ctypes fields: pynvml's wrapper changes nothing
    attr = _READ.get(get(v, "valueType"), "ullVal")
    if attr == "dVal" and f.integer:
        attr = "ullVal"  # some drivers leave valueType unset (0) on integer fields such as ECC
    return get(get(v, "value"), attr)


class _Answer:
    """The entries of one answered request, in order, read as :func:`_value` reads them."""

    __slots__ = ("doubles", "n", "raw", "req", "untouched")

    def __init__(self, req: _Request) -> None:
        self.req = req
        self.raw = req.entries.unpack_from(req.values)
        self.doubles: tuple[float, ...] = ()  # unpacked when a double is met
        self.n = 0
        self.untouched = False

    def unset(self) -> bool:
        """Whether the entry :meth:`next` gave last is as the caller passed it: no time
        stamp, no latency, value type 0 (DCGM's test for NVIDIA bug 2009232)."""
        return self.untouched

    def next(self, integer: bool) -> tuple[int, int, int, Value]:
        """(fieldId, timestamp in us, nvmlReturn, value) of the next entry; the value is
        the union's member for its valueType (ullVal for an integer field's dVal)."""
        n = self.n
        self.n = n + 1
        fid, stamp, latency, kind, ret, bits = self.raw[6 * n : 6 * n + 6]
        self.untouched = stamp == 0 and latency == 0 and kind == N.NVML_VALUE_TYPE_DOUBLE
        if kind in _AS_IS:
            return fid, stamp, ret, bits
        if kind == N.NVML_VALUE_TYPE_DOUBLE and not integer:
            self.doubles = self.doubles or self.req.doubles.unpack_from(self.req.values)
            return fid, stamp, ret, self.doubles[n]
        return fid, stamp, ret, _of_bits(bits, _INTEGER.get(kind, "ullVal"))


def _of_bits(bits: int, attr: str) -> int:
    """The union member ``attr`` (an integer one) read from the value's 8 bytes."""
    width = _BITS[attr]
    if width < 64:
        bits &= (1 << width) - 1
    if attr in _SIGNED and bits >> (width - 1):
        bits -= 1 << width
    return bits


def _where(dev: Device) -> str:
    if dev.is_mig:
        return f"GPU {dev.index} MIG instance {dev.gi} ({dev.profile})"
    return f"GPU {dev.index} ({dev.uuid})"
