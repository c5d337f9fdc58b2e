"""Request-derived text the exporter reads: Accept-Encoding, and host /proc cgroup files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.kube.cgroups import parse_cgroup
from exporter.server import wants_gzip
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
