"""Request-derived input the exporter reads: request heads (the header budget),
Accept-Encoding, and host /proc cgroup files."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.http.headers import HeaderBudget
from exporter.http.routes import wants_gzip
from exporter.workloads.cgroups import ContainerRef, parse_cgroup
from tests.fuzz.strategies import FAST, TEXT

CODING = st.sampled_from(["gzip", "GZIP", "x-gzip", "deflate", "br", "identity", "*", "zstd"])
Q = st.one_of(
    st.none(),
    st.floats(0, 1).map(lambda q: f"{q:.3f}"),
    st.sampled_from(["0", "1", "0.0", "abc", "", "nan", "-1", "2", "1e400"]),
)


@FAST
@given(
    st.one_of(
        TEXT,
        st.lists(st.tuples(CODING, Q), max_size=5).map(
            lambda es: ", ".join(c if q is None else f"{c};q={q}" for c, q in es)
        ),
    )
)
def test_accept_encoding_never_raises(header):
    assert wants_gzip(header) in (True, False)


# RFC 9110 §12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
QVALUE = re.compile(r"0(\.\d{0,3})?|1(\.0{0,3})?")


def rfc_9110_gzip(entries: list[tuple[str, str | None]]) -> bool:
    """Whether gzip is acceptable and at least as preferred as no coding, by RFC 9110
    §12.5.3, for header elements naming distinct codings. Where the RFC has no rule
    (a weight that is not a qvalue) the element refuses its coding."""
    weight = {}
    for coding, q in entries:
        name = {"x-gzip": "gzip"}.get(coding.lower(), coding.lower())  # §8.4.1.3
        weight[name] = 1.0 if q is None else float(q) if QVALUE.fullmatch(q) else 0.0
    # "*" matches any coding not listed; a listed coding with q=0 is not acceptable
    gz = weight.get("gzip", weight.get("*", 0.0))
    # identity is acceptable unless "identity;q=0", or "*;q=0" with no identity entry;
    # not listed at all, it has no stated preference
    identity = weight.get("identity", weight.get("*"))
    if gz == 0:
        return False
    if identity is not None and identity == 0:
        return True  # gzip is the only acceptable representation
    return identity is None or gz >= identity


@FAST
@given(
    st.lists(
        st.tuples(CODING, Q),
        min_size=1,
        max_size=5,
        unique_by=lambda e: {"x-gzip": "gzip"}.get(e[0].lower(), e[0].lower()),
    )
)
def test_gzip_exactly_when_rfc_9110_prefers_it(entries):
    header = ", ".join(c if q is None else f"{c};q={q}" for c, q in entries)
    assert wants_gzip(header) is rfc_9110_gzip(entries), header


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),  # what Prometheus sends
        ("gzip, deflate, br", True),
        ("GZIP", True),  # codings are case-insensitive (§8.4.1)
        ("x-gzip", True),  # §8.4.1.3: x-gzip is gzip
        ("gzip;Q=0.001", True),  # the parameter name too
        ("gzip;q=0", False),  # "not acceptable"
        ("gzip;q=0.5, identity", False),  # identity (q=1) preferred
        ("gzip;q=0.5, identity;q=0.4", True),
        ("*", True),  # "*" matches every coding not listed
        ("*;q=0", False),
        ("gzip;q=0, *", False),  # the listed coding's own weight
        ("identity;q=0, *", True),  # identity refused: gzip is all that is left
        ("identity;q=0", False),  # nothing acceptable: plain, as the RFC allows
        ("deflate, br", False),
        ("identity", False),
        ("", False),  # an empty value: no coding wanted
        ("gzip;q=1.5", False),  # not a qvalue
        ("gzip;q=0.0001", False),  # a qvalue has three decimals at most
        ("gzip;q=abc", False),
    ],
)
def test_accept_encoding_examples(header, gzipped):
    assert wants_gzip(header) is gzipped


# What the kubelet and the container runtimes write (kubelet's cgroup manager: the pod's
# cgroup "pod<uid>", "kubepods-<qos>-pod<uid with _>.slice" under systemd; the runtime's
# container cgroup named after its 64-hex ID), and cgroups of processes outside any pod.
HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
QOS = st.sampled_from(["", "burstable", "besteffort"])  # "": Guaranteed pods sit higher
HOST_LINES = st.sampled_from(
    ["0::/system.slice/containerd.service", "1:name=systemd:/user.slice/user-0.slice",
     "0::/", "0::/init.scope", "12:memory:/system.slice/kubelet.service"]
)  # fmt: skip


def pod_cgroup(uid: str, qos: str, container: str, driver: str, runtime: str, v1: bool) -> str:
    """One /proc/<pid>/cgroup line of a process in a container, as the node writes it."""
    if driver == "systemd":
        under = uid.replace("-", "_")
        pod = f"kubepods-{qos}-pod{under}.slice" if qos else f"kubepods-pod{under}.slice"
        parents = "/kubepods.slice/" + (f"kubepods-{qos}.slice/" if qos else "")
        scope = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[runtime]
        path = f"{parents}{pod}/{scope}-{container}.scope"
    else:
        path = "/kubepods/" + (f"{qos}/" if qos else "") + f"pod{uid}/{container}"
    return f"4:memory:{path}" if v1 else f"0::{path}"


@FAST
@given(
    st.uuids().map(str),
    QOS,
    HEX64,
    st.sampled_from(["systemd", "cgroupfs"]),
    st.sampled_from(["containerd", "crio", "docker"]),
    st.booleans(),
    st.lists(HOST_LINES, max_size=3),
    st.integers(0, 3),
)
def test_cgroup_files_give_the_pod_and_container(uid, qos, cid, driver, runtime, v1, noise, at):
    line = pod_cgroup(uid, qos, cid, driver, runtime, v1)
    lines = [*noise]
    lines.insert(min(at, len(lines)), line)
    assert parse_cgroup("\n".join(lines)) == ContainerRef(uid, cid)


@FAST
@given(st.lists(st.one_of(TEXT, HOST_LINES), max_size=8).map("\n".join))
def test_cgroup_files_parse_or_give_none(text):
    """Anything else: None, or a pod UID that the text itself carries (never a made-up one)."""
    ref = parse_cgroup(text)
    if ref is not None:
        assert ref.pod_uid in text or ref.pod_uid.replace("-", "_") in text
        assert "pod" in text


def test_processes_outside_pods_have_no_pod():
    host = "0::/system.slice/containerd.service\n1:name=systemd:/user.slice\n0::/"
    assert parse_cgroup(host) is None


def _verdict(chunks: list[bytes], limit: int) -> bool:
    budget = HeaderBudget(limit)
    return all(budget.feed(c) for c in chunks)


HEAD = st.builds(
    lambda path, n, size: (
        b"GET /%s HTTP/1.1\r\nHost: x\r\n" % path
        + b"".join(b"X-%d: %s\r\n" % (i, b"v" * size) for i in range(n))
        + b"\r\n"
    ),
    st.binary(max_size=40).map(
        lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b" ", b"")
    ),
    st.integers(0, 40),
    st.integers(0, 600),
)


@FAST
@given(st.lists(HEAD, min_size=1, max_size=4), st.data())
def test_header_budget_is_per_request_and_chunking_does_not_matter(heads, data):
    """Pipelined requests in any chunking: refused exactly when one head is over the budget."""
    limit = 4096
    stream = b"".join(heads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert _verdict(chunks, limit) == all(len(h) <= limit for h in heads)


@FAST
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_any_bytes_get_a_verdict_and_bounded_state(junk, step):
    """Junk never raises, and what the guard keeps stays within the budget."""
    budget = HeaderBudget(1024)
    for i in range(0, len(junk), step):
        if not budget.feed(junk[i : i + step]):
            break
        assert len(budget.head) <= 1024
