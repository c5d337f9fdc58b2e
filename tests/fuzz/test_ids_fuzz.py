"""Device IDs from the kubelet (any string a device plugin may send): parsed or None,
never an exception; every form the exporter documents parses back to its parts."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.workloads import ids
from tests.fuzz.strategies import FAST, TEXT

UUIDS = st.uuids().map(str)
REPLICA = st.one_of(st.just(""), st.integers(0, 999).map(lambda n: f"::{n}"))
PIECES = st.sampled_from(["GPU-", "MIG-", "MIG-GPU-", "nvidia", "/gi", "/vgpu", "::", "/", "-"])
NEAR = st.lists(st.one_of(PIECES, UUIDS, st.integers(-5, 99).map(str), TEXT), max_size=6).map(
    "".join
)


def _inventory():
    sim.install(None)
    col = Collector(load(default_metrics_file()), "n")
    try:
        snap = col.collect()
    finally:
        col.close()
        sim.uninstall()
    return snap.gpus, tuple(d for d in snap.entities if d.is_mig)


GPUS, MIGS = _inventory()
RESOLVER = ids.Resolver(GPUS, MIGS)


@FAST
@given(st.one_of(TEXT, NEAR))
def test_any_string_parses_or_is_none(device_id):
    ref = ids.parse(device_id)
    if ref is None:
        return
    assert ref.raw == device_id.strip()
    key = RESOLVER.key(ref)
    assert key is None or key in {d.key for d in GPUS + MIGS}


@FAST
@given(UUIDS, REPLICA)
def test_uuid_forms(u, replica):
    for prefix in ("GPU-", "MIG-"):
        ref = ids.parse(f"{prefix}{u}{replica}")
        assert ref is not None and ref.uuid == f"{prefix}{u}"
        assert ref.replica == replica.removeprefix("::")


@FAST
@given(UUIDS, st.integers(0, 14), st.integers(0, 7), REPLICA)
def test_old_mig_form(u, gi, ci, replica):
    ref = ids.parse(f"MIG-GPU-{u}/{gi}/{ci}{replica}")
    assert ref is not None
    assert (ref.parent_uuid, ref.gi, ref.ci) == (f"GPU-{u}", gi, ci)


@FAST
@given(
    st.integers(0, 63),
    st.one_of(st.none(), st.integers(0, 14)),
    st.one_of(st.none(), st.integers(0, 99)),
)
def test_gke_form(minor, gi, vgpu):
    text = (
        f"nvidia{minor}"
        + (f"/gi{gi}" if gi is not None else "")
        + (f"/vgpu{vgpu}" if vgpu is not None else "")
    )
    ref = ids.parse(text)
    assert ref is not None and (ref.minor, ref.gi) == (minor, gi)
    assert ref.replica == ("" if vgpu is None else str(vgpu))


def test_real_devices_resolve_to_themselves():
    for d in GPUS + MIGS:
        assert RESOLVER.key(ids.parse(d.key)) == d.key
        assert RESOLVER.key(ids.parse(f"{d.key}::3")) == d.key
    assert RESOLVER.key(ids.parse(f"GPU-{uuid.uuid4()}")) is None


@FAST
@given(
    st.sampled_from(
        ["nvidia", "nvidia1/gi", "nvidia1/vgpu", "MIG-GPU-0000aaaa-bb/", "MIG-GPU-0000aaaa-bb/1/"]
    ),
    st.integers(10, 6000),
    st.sampled_from(["", "::1", "/0"]),
)
def test_numbers_of_any_length_never_raise(prefix, digits, suffix):
    # int() of more than 4,300 digits raises: such IDs must come back None, not raise
    assert ids.parse(prefix + "9" * digits + suffix) is None


@FAST
@given(st.text(min_size=ids.MAX_DEVICE_ID_CHARS + 1, max_size=ids.MAX_DEVICE_ID_CHARS + 50))
def test_ids_past_the_length_bound_are_malformed(device_id):
    assert ids.parse(device_id) is None
    assert ids.parse("GPU-" + "a" * ids.MAX_DEVICE_ID_CHARS) is None
