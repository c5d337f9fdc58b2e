"""Device-ID forms the kubelet reports, resolved against a real enumeration."""

import pytest

from exporter.workloads.ids import DeviceRef, Resolver, parse


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (
            "GPU-6c9ff8e1-a498-59c2-a440-23fddb3a736b",
            {"uuid": "GPU-6c9ff8e1-a498-59c2-a440-23fddb3a736b"},
        ),
        (
            "MIG-67414d49-5e5b-57fd-b6db-3450c5f79eb6",
            {"uuid": "MIG-67414d49-5e5b-57fd-b6db-3450c5f79eb6"},
        ),
        ("GPU-6c9ff8e1-a498-59c2-a440-23fddb3a736b::3", {"replica": "3"}),
        ("MIG-GPU-6c9ff8e1-a498-59c2-a440-23fddb3a736b/7/0", {"gi": 7, "ci": 0}),
        ("MIG-GPU-6c9ff8e1-a498-59c2-a440-23fddb3a736b/7/0::1", {"gi": 7, "replica": "1"}),
        ("nvidia3", {"minor": 3, "gi": None}),
        ("nvidia3/gi2", {"minor": 3, "gi": 2}),
        ("nvidia3/vgpu4", {"minor": 3, "replica": "4"}),
        ("nvidia3/gi2/vgpu1", {"minor": 3, "gi": 2, "replica": "1"}),
    ],
)
def test_parse_forms(raw, want):
    ref = parse(raw)
    assert ref is not None
    for k, v in want.items():
        assert getattr(ref, k) == v


@pytest.mark.parametrize("raw", ["", "fpga-0", "gpu-0", "nvidiaX", "GPU-", "MIG-GPU-x/1"])
def test_unknown_forms(raw):
    assert parse(raw) is None


def test_resolves_every_form_against_the_default_node(inventory):
    gpus, migs = inventory
    assert len(gpus) == 8
    r = Resolver(gpus.values(), migs.values())
    g6 = gpus[6].uuid
    assert r.key(parse(gpus[0].uuid)) == gpus[0].key
    assert r.key(parse(gpus[0].uuid + "::2")) == gpus[0].key
    assert r.key(parse("nvidia4")) == gpus[4].key
    assert r.key(parse(migs[(6, 8)].key)) == migs[(6, 8)].key
    assert r.key(parse(f"MIG-{g6}/8/0")) == migs[(6, 8)].key
    assert r.key(parse("nvidia7/gi2")) == migs[(7, 2)].key
    assert r.key(parse("nvidia9")) is None
    assert r.key(parse(f"MIG-{g6}/99/0")) is None
    assert r.key(DeviceRef("x")) is None


def test_dynamic_mig_resolves_by_parent_and_profile(inventory):
    gpus, migs = inventory
    r = Resolver(gpus.values(), migs.values())
    assert r.by_profile(gpus[7].uuid, "3g.40gb") == migs[(7, 2)].key
    assert r.by_profile(gpus[6].uuid, "1g.10gb") is None  # seven of them: cannot tell which
    assert r.by_profile(gpus[0].uuid, "1g.10gb") is None  # no MIG on GPU 0
