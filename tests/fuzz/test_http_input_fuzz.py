"""Request-derived input the exporter reads: request heads (the header budget),
Accept-Encoding, and host /proc cgroup files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.http.headers import HeaderBudget
from exporter.http.routes import wants_gzip
from exporter.kube.cgroups import parse_cgroup
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


@FAST
@given(st.lists(st.tuples(CODING, Q), min_size=1, max_size=5))
def test_gzip_only_when_its_first_entry_accepts_it(entries):
    header = ", ".join(c if q is None else f"{c};q={q}" for c, q in entries)
    first = next((q for c, q in entries if c.lower() in ("gzip", "x-gzip")), "absent")
    if first == "absent":
        expected = False
    elif first is None:
        expected = True
    else:
        try:
            expected = 0 < float(first) <= 1
        except ValueError:
            expected = False
    assert wants_gzip(header) is expected


@FAST
@given(
    st.lists(
        st.one_of(
            TEXT,
            st.sampled_from(
                [
                    "0::/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-"
                    + "ab" * 32
                    + ".scope",
                    "12:memory:/kubepods/burstable/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789/"
                    + "cd" * 32,
                    "1:name=systemd:/",
                    "0::/",
                    ":::",
                    "x:y",
                ]
            ),
        ),
        max_size=8,
    ).map("\n".join)
)
def test_cgroup_files_parse_or_give_none(text):
    ref = parse_cgroup(text)
    assert ref is None or ref.pod_uid


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
