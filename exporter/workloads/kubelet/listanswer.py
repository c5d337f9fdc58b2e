"""The kubelet's ``List`` answer, bounded while it is decoded.

protobuf decodes a repeated field however long it is: a 4 MiB answer of two
million empty pod entries becomes two million messages (about 130 MiB of RSS,
protobuf alone) before any bound could look at them. So the answer's framing is
walked here first, and protobuf's generated classes (exporter/workloads/kubelet/generated/)
decode only what the walk accepted:

- the fields the mapper reads: pods (name, namespace, containers), containers
  (name, device-plugin devices, DRA claims), devices (resource name, IDs), claims
  (names, their devices and CDI device names); every other field (``cpu_ids``,
  ``memory``, ``topology``, fields this schema does not know) is skipped unread;
- entries up to the bounds of limits.py: pods per answer, containers per pod,
  device entries (device-plugin and DRA) per answer, device IDs (device-plugin
  IDs, DRA devices and their CDI names) per answer; entries past a bound are
  dropped and counted by input (``kubelet_pods``, ``containers``,
  ``device_entries``, ``device_ids``);
- at most ``limits.MAX_LIST_FIELDS`` fields in all, at any depth, so the walk's
  CPU is bounded too: past that, the rest of the answer is dropped (the pods
  accepted so far are kept) and counted once under ``kubelet_fields``.

A message nothing was dropped from is handed on as its own bytes. Framing that
protobuf would refuse (a truncated varint, tag or length, a length past its
message, field number 0, wire types 3, 4, 6 or 7) raises InvalidAnswer, as does
what protobuf refuses in what was kept (a string that is not UTF-8).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from exporter.workloads import limits
from exporter.workloads.kubelet.generated import podresources_pb2 as pb

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class InvalidAnswer(ValueError):
    """The bytes are not a valid encoding of a ``List`` answer."""


class _OutOfFields(Exception):
    """The walk used up ``limits.MAX_LIST_FIELDS``."""


DROP: Any = object()  # an entry left out of what protobuf is given


@dataclass(frozen=True, slots=True)
class _Repeated:
    """Entries of a repeated field, counted against ``bound`` (per answer, or per parent
    message when ``per_parent``); dropped past it as ``what``. ``schema``: the entries'
    own fields (None for strings)."""

    what: str
    bound: int
    schema: dict[int, Any] | None = None
    per_parent: int = 0  # 1: counted per parent message, not per answer


TEXT: Any = object()  # a string field the mapper reads: kept as it is

_IDS = ("device_ids", limits.MAX_DEVICE_IDS)
_ENTRIES = ("device_entries", limits.MAX_DEVICE_ENTRIES)
_CDI = {1: TEXT}
_CLAIM_RESOURCE = {1: _Repeated(*_IDS, _CDI), 2: TEXT, 3: TEXT, 4: TEXT, 5: TEXT}
_DYNAMIC = {2: TEXT, 3: TEXT, 4: _Repeated(*_IDS, _CLAIM_RESOURCE)}
_DEVICES = {1: TEXT, 2: _Repeated(*_IDS)}
_CONTAINER = {1: TEXT, 2: _Repeated(*_ENTRIES, _DEVICES), 5: _Repeated(*_ENTRIES, _DYNAMIC)}
_POD = {
    1: TEXT,
    2: TEXT,
    3: _Repeated("containers", limits.MAX_CONTAINERS_PER_POD, _CONTAINER, per_parent=1),
}
_LIST = {1: _Repeated("kubelet_pods", limits.MAX_KUBELET_PODS, _POD)}


def decode(raw: bytes) -> tuple[Any, Counter[str]]:
    """The ``List`` answer in ``raw`` as a ``v1.ListPodResourcesResponse``, within the
    bounds, and the counts of what was dropped by input; raises InvalidAnswer."""
    walk = _Walk(raw)
    kept = walk.answer()
    try:
        return pb.ListPodResourcesResponse.FromString(raw if kept is None else kept), walk.drops
    except DecodeError:
        raise InvalidAnswer("protobuf does not decode it (a string that is not UTF-8?)") from None


def _varint(buf: bytes, pos: int, end: int, most: int) -> tuple[int, int]:
    """The varint at ``pos`` (at most ``most`` bytes) and the position after it."""
    result = shift = 0
    for i in range(pos, min(end, pos + most)):
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i + 1
        shift += 7
    raise InvalidAnswer("a truncated or overlong varint")


def _header(buf: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """The field at ``pos``: (its tag, where its tag ends, where its value starts, where it
    stops); raises InvalidAnswer for framing protobuf refuses."""
    tag, tag_end = _varint(buf, pos, end, 5)
    if tag > 0xFFFF_FFFF:
        raise InvalidAnswer("a field tag over 32 bits")
    if tag < 8:
        raise InvalidAnswer("field number 0")
    wire_type = tag & 7
    if wire_type == LENGTH:
        size, value = _varint(buf, tag_end, end, 5)
        stop = value + size
    elif wire_type == VARINT:
        value, stop = tag_end, _varint(buf, tag_end, end, 10)[1]
    elif wire_type in (FIXED64, FIXED32):
        value, stop = tag_end, tag_end + (8 if wire_type == FIXED64 else 4)
    else:
        raise InvalidAnswer(f"wire type {wire_type} (a group, or none)")
    if stop > end:
        raise InvalidAnswer("a field runs past the end of its message")
    return tag, tag_end, value, stop


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Walk:
    """One walk over one answer: the fields left, the per-answer counts, the drops."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.left = limits.MAX_LIST_FIELDS
        self.taken: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()

    def answer(self) -> bytes | None:
        """The answer's accepted bytes, or None when that is all of them."""
        buf, end = self.buf, len(self.buf)
        parts: list[bytes] = []
        pos = run = 0
        pods = _LIST[1]
        while pos < end:
            tag, tag_end, value, stop = _header(buf, pos, end)
            try:
                self.left -= 1
                if self.left < 0:
                    raise _OutOfFields
                kept = self._entry(pods, value, stop, 0) if tag == 0x0A else DROP
            except _OutOfFields:  # keep the pods walked whole; the rest goes
                self.drops["kubelet_fields"] = 1  # once: the walk ends here
                return b"".join([*parts, buf[run:pos]])
            if kept is not None:
                parts.append(buf[run:pos])
                if kept is not DROP:
                    parts.append(buf[pos:tag_end] + _encode_varint(len(kept)) + kept)
                run = stop
            pos = stop
        return b"".join([*parts, buf[run:end]]) if run else None

    def message(self, pos: int, end: int, schema: dict[int, Any]) -> Any:
        """The bytes of the message in ``buf[pos:end]`` as accepted, or None when that is
        all of them. No call for the usual one-byte tags and lengths, nor for a string:
        this loop runs for every field of the answer."""
        buf, taken, left = self.buf, self.taken, self.left
        parts: list[bytes] = []
        run, own = pos, 0  # run: where the bytes kept as they are start; own: entries here
        while pos < end:
            left -= 1
            if left < 0:
                raise _OutOfFields
            tag = buf[pos]
            if 9 < tag < 0x80 and tag & 7 == LENGTH and pos + 1 < end and buf[pos + 1] < 0x80:
                tag_end, value = pos + 1, pos + 2
                stop = value + buf[pos + 1]
            else:
                tag, tag_end, value, stop = _header(buf, pos, end)
            if stop > end:
                raise InvalidAnswer("a field runs past the end of its message")
            rule = schema.get(tag >> 3) if tag & 7 == LENGTH else None
            if rule is TEXT:
                kept = None
            elif rule is None:
                kept = DROP  # a field the mapper does not read
            elif rule.schema is None:  # a repeated string, counted here
                n = taken[rule.what] = taken[rule.what] + 1
                kept = None if n <= rule.bound else self._over(rule)
            else:
                own += rule.per_parent
                self.left = left
                kept = self._entry(rule, value, stop, own)
                left = self.left
            if kept is not None:
                parts.append(buf[run:pos])
                if kept is not DROP:  # the entry, rebuilt: tag, new length, accepted bytes
                    parts.append(buf[pos:tag_end] + _encode_varint(len(kept)) + kept)
                run = stop
            pos = stop
        self.left = left
        return b"".join([*parts, buf[run:end]]) if parts else None

    def _over(self, rule: _Repeated) -> Any:
        """Count an entry dropped past its bound."""
        self.drops[rule.what] += 1
        return DROP

    def _entry(self, rule: _Repeated, value: int, stop: int, own: int) -> Any:
        """An entry of a repeated message field: None (kept as it is), DROP (past its
        bound) or its accepted bytes. ``own``: the entries of this field in the parent so
        far; raises _OutOfFields once the walk has used up its fields."""
        if not rule.per_parent:
            own = self.taken[rule.what] = self.taken[rule.what] + 1
        if own > rule.bound:
            return self._over(rule)
        return self.message(value, stop, rule.schema) if rule.schema is not None else None
