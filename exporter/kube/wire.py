"""The kubelet's ``List`` answer decoded from the protobuf wire format, without protobuf.

Only the part of ``v1.ListPodResourcesResponse`` (proto/podresources.proto) that the
mapper reads becomes objects, with the attribute names and proto3 defaults of the
generated classes ("" for an unset string, including the optional ``share_id``; []
for a repeated field). Every other field is skipped, but checked as protobuf checks
it: known sub-messages (``cpu_ids``, ``memory``, ``topology``) are decoded and
dropped, so that an answer this module accepts is one protobuf accepts too.

Malformed input raises :class:`WireError`: a truncated varint, tag or length, a
length past the end of its message, a varint over 10 bytes (a tag or length over 5),
field number 0, wire types 3, 4 (groups; protobuf skips a group in an unknown field,
no kubelet sends one), 6 or 7, or a string that is not UTF-8. The work is one pass
over the bytes: the nesting follows the schema (at most six messages deep), never the
input.
"""

from __future__ import annotations

from typing import Any, ClassVar

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
MASK64 = (1 << 64) - 1
MAX_TAG = 0xFFFF_FFFF

STR = "str"  # a string field: the last one given wins
STRS = "strs"  # a repeated string field
INTS = "ints"  # a repeated integer field, packed: checked, not kept

Kind = Any  # STR, STRS, INTS, or a _Message subclass (a repeated or singular message)


class WireError(ValueError):
    """The bytes are not a valid encoding of the message."""


def _varint(buf: bytes, pos: int, end: int, most: int = 10) -> tuple[int, int]:
    """The varint at ``pos`` (at most ``most`` bytes, 64 bits kept) and the position after."""
    if pos >= end:
        raise WireError("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift, pos = b & 0x7F, 7, pos + 1
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & MASK64, pos
        shift += 7
        if shift >= 7 * most:
            raise WireError(f"varint longer than {most} bytes")


def _skip(buf: bytes, wire_type: int, pos: int, end: int) -> tuple[int, int]:
    """Skip one field's value: (its varint value, or the start of its bytes; the end)."""
    if wire_type == VARINT:
        return _varint(buf, pos, end)
    if wire_type == LENGTH:
        size, pos = _varint(buf, pos, end, 5)
        stop = pos + size
    elif wire_type == FIXED64:
        stop = pos + 8
    elif wire_type == FIXED32:
        stop = pos + 4
    elif wire_type in (START_GROUP, END_GROUP):
        raise WireError("group (wire type 3 or 4): not used by proto3")
    else:
        raise WireError(f"invalid wire type {wire_type}")
    if stop > end:
        raise WireError("field runs past the end of its message")
    return pos, stop


def _text(buf: bytes, start: int, stop: int) -> str:
    try:
        return buf[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("string field is not UTF-8") from None


def _packed(buf: bytes, pos: int, end: int) -> None:
    """Check a packed run of varints."""
    while pos < end:
        _, pos = _varint(buf, pos, end)


class _Message:
    """A decoded message: ``_schema`` maps field numbers to (attribute or None, kind)."""

    __slots__ = ()
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {}

    def __init__(self) -> None:
        for name, kind in self._schema.values():
            if name is not None:
                setattr(self, name, "" if kind is STR else [])

    def __eq__(self, other: object) -> bool:
        slots: tuple[str, ...] = self.__slots__
        return type(other) is type(self) and all(
            getattr(self, s) == getattr(other, s) for s in slots
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like protobuf's messages

    def __repr__(self) -> str:
        slots: tuple[str, ...] = self.__slots__
        inner = ", ".join(f"{s}={getattr(self, s)!r}" for s in slots)
        return f"{type(self).__name__}({inner})"


def _field(obj: _Message, name: str | None, kind: Kind, buf: bytes, a: int, b: int) -> None:
    """Store (or only check) one length-delimited field of ``obj``."""
    if kind is STR or kind is STRS:
        text = _text(buf, a, b)
        if name is None:
            return
        if kind is STR:
            setattr(obj, name, text)
        else:
            getattr(obj, name).append(text)
    elif kind is INTS:
        _packed(buf, a, b)
    else:
        sub = _decode(buf, a, b, kind)
        if name is not None:
            getattr(obj, name).append(sub)


def _decode(buf: bytes, pos: int, end: int, cls: type[_Message]) -> Any:
    """The message of class ``cls`` encoded in ``buf[pos:end]``."""
    obj = cls()
    schema = cls._schema
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:  # the usual one-byte tag and length, without calls
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end, 5)
            if tag > MAX_TAG:
                raise WireError("field tag over 32 bits")
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == LENGTH and pos < end and buf[pos] < 0x80:
            a, pos = pos + 1, pos + 1 + buf[pos]
            if pos > end:
                raise WireError("field runs past the end of its message")
        else:
            a, pos = _skip(buf, wire_type, pos, end)
        known = schema.get(number)
        # a known field with another wire type is an unknown field to protobuf
        if known is not None and wire_type == LENGTH:
            _field(obj, known[0], known[1], buf, a, pos)
    return obj


class _Check(_Message):
    """A message that is checked and dropped."""

    __slots__ = ()


class _NUMANode(_Check):
    __slots__ = ()
    # ID, an int64: a singular number is never packed, so nothing to check beyond its tag
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {}


class _TopologyInfo(_Check):
    __slots__ = ()
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {1: (None, _NUMANode)}


class _ContainerMemory(_Check):
    __slots__ = ()
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        1: (None, STR),  # 2, size: a singular number, as NUMANode's ID
        3: (None, _TopologyInfo),
    }


class CDIDevice(_Message):
    """A CDI device name of a DRA claim's device."""

    __slots__ = ("name",)
    name: str
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {1: ("name", STR)}


class ClaimResource(_Message):
    """One device of a DRA claim; ``share_id`` is "" when not given."""

    __slots__ = ("cdi_devices", "device_name", "driver_name", "pool_name", "share_id")
    cdi_devices: list[CDIDevice]
    driver_name: str
    pool_name: str
    device_name: str
    share_id: str
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        1: ("cdi_devices", CDIDevice),
        2: ("driver_name", STR),
        3: ("pool_name", STR),
        4: ("device_name", STR),
        5: ("share_id", STR),
    }


class DynamicResource(_Message):
    """A DRA claim of a container."""

    __slots__ = ("claim_name", "claim_namespace", "claim_resources")
    claim_name: str
    claim_namespace: str
    claim_resources: list[ClaimResource]
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        2: ("claim_name", STR),
        3: ("claim_namespace", STR),
        4: ("claim_resources", ClaimResource),
    }


class ContainerDevices(_Message):
    """Device-plugin devices of one resource name held by a container."""

    __slots__ = ("device_ids", "resource_name")
    resource_name: str
    device_ids: list[str]
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        1: ("resource_name", STR),
        2: ("device_ids", STRS),
        3: (None, _TopologyInfo),
    }


class ContainerResources(_Message):
    """One container's devices and DRA claims."""

    __slots__ = ("devices", "dynamic_resources", "name")
    name: str
    devices: list[ContainerDevices]
    dynamic_resources: list[DynamicResource]
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        1: ("name", STR),
        2: ("devices", ContainerDevices),
        3: (None, INTS),  # cpu_ids, packed
        4: (None, _ContainerMemory),
        5: ("dynamic_resources", DynamicResource),
    }


class PodResources(_Message):
    """One pod's containers."""

    __slots__ = ("containers", "name", "namespace")
    name: str
    namespace: str
    containers: list[ContainerResources]
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {
        1: ("name", STR),
        2: ("namespace", STR),
        3: ("containers", ContainerResources),
    }


class ListPodResourcesResponse(_Message):
    """The kubelet's ``List`` answer: every pod with resources on the node."""

    __slots__ = ("pod_resources",)
    pod_resources: list[PodResources]
    _schema: ClassVar[dict[int, tuple[str | None, Kind]]] = {1: ("pod_resources", PodResources)}


def decode(raw: bytes) -> ListPodResourcesResponse:
    """The ``List`` answer encoded in ``raw``; raises WireError when it does not decode."""
    return _decode(raw, 0, len(raw), ListPodResourcesResponse)
