"""workloads/kubelet/listanswer.py against protobuf's own decoder of the kubelet's List answer.

The answers are built and encoded with the generated protobuf classes, then decoded by
protobuf alone and through the bounded walk. Within the bounds, both give the same fields
the mapper reads. Two documented differences: the walk refuses a group (wire types 3 and 4,
proto2's groups) in an unknown field, which protobuf skips (no proto3 kubelet sends one);
and it skips the fields the mapper does not read without looking inside them, so bytes
protobuf would refuse there (a memory type that is not UTF-8) do not stop the mapping.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.workloads.kubelet import listanswer
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import INVALID, KubeletUnavailable, parse
from tests.fuzz.strategies import FAST

NAME = st.text(
    st.characters(blacklist_categories=("Cs",)), max_size=12
)  # any Unicode but lone surrogates
INT64 = st.integers(-(2**63), 2**63 - 1)
GROUP = "group"  # the documented difference: in InvalidAnswer's reason


def plain(msg: Any) -> Any:
    """The fields the mapper reads, as nested lists, from either decoder's message."""
    return [
        (
            p.name,
            p.namespace,
            [
                (
                    c.name,
                    [(d.resource_name, list(d.device_ids)) for d in c.devices],
                    [
                        (
                            dr.claim_name,
                            dr.claim_namespace,
                            [
                                (
                                    r.driver_name,
                                    r.pool_name,
                                    r.device_name,
                                    r.share_id,
                                    [cdi.name for cdi in r.cdi_devices],
                                )
                                for r in dr.claim_resources
                            ],
                        )
                        for dr in c.dynamic_resources
                    ],
                )
                for c in p.containers
            ],
        )
        for p in msg.pod_resources
    ]


def _topology(draw: Any, owner: Any) -> None:
    if draw(st.booleans()):
        owner.topology.SetInParent()
        for node in draw(st.lists(INT64, max_size=3)):
            owner.topology.nodes.add(ID=node)


def _claims(draw: Any, c: Any) -> None:
    for _ in range(draw(st.integers(0, 2))):
        dr = c.dynamic_resources.add(claim_name=draw(NAME), claim_namespace=draw(NAME))
        for _ in range(draw(st.integers(0, 3))):
            r = dr.claim_resources.add(
                driver_name=draw(st.sampled_from(["gpu.nvidia.com", "x"])),
                pool_name=draw(NAME),
                device_name=draw(NAME),
            )
            share = draw(st.one_of(st.none(), NAME))
            if share is not None:
                r.share_id = share  # set, even to "": protobuf then encodes it
            for cdi in draw(st.lists(NAME, max_size=2)):
                r.cdi_devices.add(name=cdi)


@st.composite
def answers(draw: Any) -> pb.ListPodResourcesResponse:
    """A List answer with every field of the schema filled now and then."""
    resp = pb.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, 8))):
        pod = resp.pod_resources.add(name=draw(NAME), namespace=draw(NAME))
        for _ in range(draw(st.integers(0, 3))):
            c = pod.containers.add(name=draw(NAME))
            for _ in range(draw(st.integers(0, 3))):
                d = c.devices.add(resource_name=draw(NAME))
                d.device_ids.extend(draw(st.lists(NAME, max_size=6)))
                _topology(draw, d)
            c.cpu_ids.extend(draw(st.lists(INT64, max_size=6)))
            for _ in range(draw(st.integers(0, 2))):
                mem = c.memory.add(memory_type=draw(NAME), size=draw(st.integers(0, 2**64 - 1)))
                _topology(draw, mem)
            _claims(draw, c)
    return resp


def ours(raw: bytes) -> Any:
    """The walk's and protobuf's fields, or the walk's InvalidAnswer."""
    try:
        msg, drops = listanswer.decode(raw)
    except listanswer.InvalidAnswer as e:
        return e
    assert drops == Counter(), drops  # the answers of these tests are within every bound
    return plain(msg)


def outcomes(raw: bytes) -> tuple[Any, Any]:
    """(protobuf's fields or None, the walk's fields or its InvalidAnswer) for the same bytes."""
    try:
        theirs = plain(pb.ListPodResourcesResponse.FromString(raw))
    except Exception:  # protobuf's DecodeError
        theirs = None
    return theirs, ours(raw)


def assert_agree(raw: bytes) -> None:
    """An answer protobuf accepts gives the same fields through the walk, unless it holds a
    group in an unknown field; an answer the walk refuses for its framing protobuf refuses
    too (the walk may accept what protobuf refuses inside a field the mapper does not read)."""
    theirs, got = outcomes(raw)
    if isinstance(got, listanswer.InvalidAnswer):
        assert theirs is None or GROUP in str(got), (raw, got)
    elif theirs is not None:
        assert got == theirs, raw


@FAST
@given(answers())
def test_valid_answers_decode_as_protobuf_decodes_them(resp: pb.ListPodResourcesResponse) -> None:
    raw = resp.SerializeToString()
    assert ours(raw) == plain(resp)


MUTATION = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "truncate"]),
    st.integers(0, 10**6),
    st.binary(min_size=1, max_size=6),
)


def mutate(raw: bytes, how: str, where: int, data: bytes) -> bytes:
    at = where % (len(raw) + 1)
    if how == "flip" and raw:
        at %= len(raw)
        return raw[:at] + bytes([raw[at] ^ data[0]]) + raw[at + 1 :]
    if how == "insert":
        return raw[:at] + data + raw[at:]
    if how == "delete":
        return raw[:at] + raw[at + len(data) :]
    return raw[:at]


@FAST
@given(answers(), st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_answers_decode_or_fail_as_protobuf_does(
    resp: pb.ListPodResourcesResponse, mutations: list[tuple[str, int, bytes]]
) -> None:
    raw = resp.SerializeToString()
    for how, where, data in mutations:
        raw = mutate(raw, how, where, data)
    assert_agree(raw)


@FAST
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_fail_as_protobuf_does(raw: bytes) -> None:
    assert_agree(raw)


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _value(draw: Any, field: Any, wire_type: int, depth: int) -> bytes:
    """The bytes after a tag: what ``field`` (None: unknown) holds, now and then not quite."""
    if wire_type == 2:
        if field is not None and field.message_type is not None:
            body = draw(fields(field.message_type, depth + 1))
        elif (field is not None and field.type == field.TYPE_STRING) or draw(st.booleans()):
            body = draw(st.binary(max_size=4) if draw(RARELY) else NAME.map(str.encode))
        else:  # packed integers
            body = b"".join(_varint(draw) for _ in range(draw(st.integers(0, 4))))
        size = len(body) + (draw(st.sampled_from([-1, 1])) if draw(RARELY) else 0)
        return varint(max(size, 0)) + body
    if wire_type == 0:
        return _varint(draw)
    if wire_type in (1, 5):
        size = 8 if wire_type == 1 else 4
        return draw(
            st.binary(min_size=size - 1, max_size=size + 1)
            if draw(RARELY)
            else st.binary(min_size=size, max_size=size)
        )
    return b""


def _varint(draw: Any) -> bytes:
    """A varint, now and then a long, truncated or over-long one."""
    if draw(RARELY):
        return draw(
            st.one_of(
                st.integers(0, 10).map(lambda n: b"\x80" * n + b"\x01"), st.binary(max_size=2)
            )
        )
    return varint(draw(st.integers(0, 2**64 - 1)))


LIST = pb.ListPodResourcesResponse.DESCRIPTOR
RARELY = st.sampled_from([False] * 24 + [True])
SOMETIMES = st.sampled_from([False] * 6 + [True])


@st.composite
def fields(draw: Any, message: Any = LIST, depth: int = 0) -> bytes:
    """Bytes shaped as ``message`` (a protobuf descriptor): mostly its own fields with their
    wire types, now and then another field number or wire type, a length off by one, a
    string that is not UTF-8 or a broken varint: the near misses where the checks of two
    decoders could differ."""
    out = b""
    for _ in range(draw(st.integers(0, 4 if depth < 6 else 0))):
        field = draw(st.none() if draw(SOMETIMES) else st.sampled_from(list(message.fields)))
        if field is None:
            number = draw(st.integers(0, 7) if draw(RARELY) else st.integers(1, 7))
            wire_type = draw(st.sampled_from([3, 4, 6, 7] if draw(RARELY) else [0, 1, 2, 5]))
        else:
            number = field.number
            # integers come packed (2) or not (0)
            usual = [2] if field.type in (field.TYPE_STRING, field.TYPE_MESSAGE) else [0, 2]
            wire_type = draw(st.sampled_from([0, 1, 2, 5] if draw(RARELY) else usual))
        out += varint(number << 3 | wire_type) + _value(draw, field, wire_type, depth)
    return out


@settings(FAST, max_examples=500)
@given(fields())
def test_field_shaped_bytes_decode_or_fail_as_protobuf_does(raw: bytes) -> None:
    assert_agree(raw)


def test_a_sixty_pod_answer_decodes_whole() -> None:
    resp = pb.ListPodResourcesResponse()
    for i in range(60):
        pod = resp.pod_resources.add(name=f"job-{i}", namespace="team-ünï")
        c = pod.containers.add(name="main")
        c.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"GPU-{i:08x}", f"nvidia{i}"])
        dr = c.dynamic_resources.add(claim_name=f"claim-{i}", claim_namespace="ns")
        r = dr.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="n", device_name="gpu-0")
        if i % 2:
            r.share_id = f"share-{i}"  # a shared device's share (DRA consumable capacity)
    raw = resp.SerializeToString()
    assert listanswer._Walk(raw).answer() is None  # nothing to leave out: handed on as it is
    got, drops = listanswer.decode(raw)
    assert got == resp and drops == Counter()
    assert got.pod_resources[59].containers[0].devices[0].device_ids == ["GPU-0000003b", "nvidia59"]
    shares = [p.containers[0].dynamic_resources[0].claim_resources[0] for p in got.pod_resources]
    assert [(r.HasField("share_id"), r.share_id) for r in shares[:2]] == [
        (False, ""),
        (True, "share-1"),
    ]


def test_fields_the_mapper_does_not_read_are_left_out() -> None:
    resp = pb.ListPodResourcesResponse()
    c = resp.pod_resources.add(name="p", namespace="ns").containers.add(name="main")
    d = c.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])
    d.topology.nodes.add(ID=1)
    c.cpu_ids.extend(range(64))
    c.memory.add(memory_type="memory", size=2**30).topology.nodes.add(ID=0)
    got, _ = listanswer.decode(resp.SerializeToString())
    c = got.pod_resources[0].containers[0]
    assert list(c.cpu_ids) == [] and list(c.memory) == []
    assert not c.devices[0].HasField("topology")
    assert plain(got) == plain(resp)
    kept = pb.ListPodResourcesResponse()
    c = kept.pod_resources.add(name="p", namespace="ns").containers.add(name="main")
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])
    # protobuf holds the fields read and nothing else (it keeps unknown fields' bytes)
    assert got.SerializeToString() == kept.SerializeToString()


def test_names_of_every_length_are_kept_beside_a_field_left_out() -> None:
    # each name's length, and its container and pod rebuilt without the cpu_ids, are
    # written in one, two or three bytes
    for chars in [*range(300), *range(16_370, 16_400)]:
        resp = pb.ListPodResourcesResponse()
        c = resp.pod_resources.add(name="p" * chars).containers.add(name="c" * chars)
        c.cpu_ids.append(1)
        got, drops = listanswer.decode(resp.SerializeToString())
        assert drops == Counter()
        assert [(p.name, [c.name for c in p.containers]) for p in got.pod_resources] == [
            ("p" * chars, ["c" * chars])
        ], chars
        assert list(got.pod_resources[0].containers[0].cpu_ids) == []


def _pod(body: bytes) -> bytes:
    """``body`` as the one PodResources of a List answer."""
    return bytes([0x0A, len(body)]) + body


SKIPPED = {
    "unknown varint": bytes([0x10, 0x96, 0x01]),
    "unknown 10-byte varint": bytes([0x10, *[0xFF] * 9, 0x01]),
    "unknown fixed64": bytes([0x19, *range(8)]),
    "unknown fixed32": bytes([0x1D, *range(4)]),
    "unknown bytes, not UTF-8": bytes([0x22, 0x02, 0xFF, 0xFE]),
    "pod name sent as a varint": _pod(bytes([0x08, 0x05])),
    "cpu_ids unpacked": _pod(bytes([0x1A, 0x04, 0x18, 0x01, 0x18, 0x7F])),
    "cpu_ids packed": _pod(bytes([0x1A, 0x05, 0x1A, 0x03, 0x01, 0x80, 0x01])),
    "reserved class_name": _pod(bytes([0x1A, 0x05, 0x2A, 0x03, 0x0A, 0x01, 0x41])),
    "tag in 5 bytes": bytes([0x8A, 0x80, 0x80, 0x80, 0x00, 0x00]),
}


@pytest.mark.parametrize("raw", SKIPPED.values(), ids=SKIPPED.keys())
def test_fields_the_mapper_does_not_read_are_skipped(raw: bytes) -> None:
    theirs, got = outcomes(raw)
    assert theirs is not None
    assert got == theirs


VARINT = "a truncated or overlong varint"
PAST = "a field runs past the end of its message"
OVER_32 = "a field tag over 32 bits"
NOT_UTF8 = "protobuf does not decode it (a string that is not UTF-8?)"
MALFORMED = {  # the bytes, and the reason the refusal gives
    "truncated varint": (bytes([0x10, 0x96]), VARINT),
    "truncated tag": (bytes([0x8A]), VARINT),
    "truncated length": (bytes([0x0A, 0x80]), VARINT),
    "a pod ending in a tag": (_pod(bytes([0x0A])), VARINT),
    "a pod ending in a tag, a field after it": (_pod(bytes([0x0A])) + bytes([0x10, 0x01]), VARINT),
    "length past the end": (bytes([0x0A, 0x05, 0x0A, 0x01]), PAST),
    "length past its message": (_pod(bytes([0x0A, 0x03, 0x41])) + bytes([0x10, 0x01]), PAST),
    "truncated fixed64": (bytes([0x19, 1, 2, 3]), PAST),
    "end group": (bytes([0x14]), "wire type 4 (a group, or none)"),
    "wire type 6": (bytes([0x16, 0x00]), "wire type 6 (a group, or none)"),
    "wire type 7": (bytes([0x17, 0x00]), "wire type 7 (a group, or none)"),
    "largest tag": (bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]), "wire type 7 (a group, or none)"),
    "field number 0": (bytes([0x02, 0x00]), "field number 0"),
    "varint over 10 bytes": (bytes([0x10, *[0xFF] * 10, 0x01]), VARINT),
    "tag over 5 bytes": (bytes([0x8A, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00]), VARINT),
    "tag over 32 bits": (bytes([0x8A, 0x80, 0x80, 0x80, 0x10, 0x00]), OVER_32),
    "tag of 2**32": (bytes([0x80, 0x80, 0x80, 0x80, 0x10, 0x00]), OVER_32),
    "length over 5 bytes": (bytes([0x0A, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]), VARINT),
    "pod name not UTF-8": (_pod(bytes([0x0A, 0x01, 0xFF])), NOT_UTF8),
    "device ID a surrogate": (
        _pod(bytes([0x1A, 0x07, 0x12, 0x05, 0x12, 0x03, 0xED, 0xA0, 0x80])),
        NOT_UTF8,
    ),
}


@pytest.mark.parametrize(("raw", "reason"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_answers_are_refused_as_protobuf_refuses_them(raw: bytes, reason: str) -> None:
    theirs, got = outcomes(raw)
    assert theirs is None
    assert isinstance(got, listanswer.InvalidAnswer)
    with pytest.raises(KubeletUnavailable) as e:
        parse(raw)
    assert str(e.value) == f"{INVALID} ({reason})"  # the warning the mapper logs


UNREAD_MALFORMED = {
    "memory type not UTF-8": _pod(bytes([0x1A, 0x07, 0x0A, 0x01, 0x63, 0x22, 0x02, 0x0A, 0xC0])),
    "packed cpu_ids truncated": _pod(bytes([0x1A, 0x07, 0x0A, 0x01, 0x63, 0x1A, 0x02, 0x80, 0x80])),
}


@pytest.mark.parametrize("raw", UNREAD_MALFORMED.values(), ids=UNREAD_MALFORMED.keys())
def test_malformed_bytes_inside_a_field_left_out_are_not_looked_at(raw: bytes) -> None:
    theirs, got = outcomes(raw)
    assert theirs is None  # protobuf refuses the whole answer
    assert got == [("", "", [("c", [], [])])]  # the walk keeps the container it reads


def test_a_group_is_refused_where_protobuf_skips_it() -> None:
    raw = bytes([0x13, 0x1B, 0x1C, 0x14])  # field 2: a group holding an empty group
    theirs, got = outcomes(raw)
    assert theirs == []
    assert isinstance(got, listanswer.InvalidAnswer) and GROUP in str(got)
