"""Parts of a DRA device several claims hold by consumable capacity (workloads/capacity.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter.frame import Owner
from exporter.workloads.capacity import claim_parts

DEV = ("gpu.nvidia.com", "node-a", "gpu-0")


@dataclass
class SliceDev:
    capacity: tuple[tuple[str, float], ...]


def holder(pod: str, claim: str, ns: str = "ml") -> Owner:
    return Owner(ns, pod, "c", claim, ns, *DEV)


def parts(holders, consumed, capacity=(("memory", 80.0),)):
    owners = {"GPU-0": tuple(holders)}
    got = claim_parts(
        owners,
        lambda ns, name, dev: consumed.get((ns, name)) if dev == DEV else None,
        lambda *dev: SliceDev(capacity) if dev == DEV else None,
    )
    return got.get("GPU-0")


def test_each_claim_gets_what_it_consumes_over_the_capacity_and_its_pods_share_it():
    holders = [holder("a", "big"), holder("b", "small", "lab"), holder("b2", "small", "lab")]
    consumed = {("ml", "big"): {"memory": 40.0}, ("lab", "small"): {"memory": 20.0}}
    shares, claims, basis = parts(holders, consumed)
    assert (claims, basis) == (2, "capacity")
    assert shares == pytest.approx((0.5, 0.125, 0.125))


def test_several_capacities_are_averaged_so_the_parts_never_pass_one():
    capacity = (("cores", 100.0), ("memory", 80.0))
    consumed = {("ml", "x"): {"memory": 64.0, "cores": 10.0}, ("ml", "y"): {"cores": 90.0}}
    shares, _, _ = parts([holder("a", "x"), holder("b", "y")], consumed, capacity)
    assert shares == pytest.approx(((0.8 + 0.1) / 2, (0.9 + 0.0) / 2))
    assert sum(shares) <= 1


def test_more_than_the_capacity_is_scaled_to_it():
    consumed = {("ml", "x"): {"memory": 80.0}, ("ml", "y"): {"memory": 80.0}}
    shares, _, basis = parts([holder("a", "x"), holder("b", "y")], consumed)
    assert basis == "capacity" and shares == pytest.approx((0.5, 0.5))


@pytest.mark.parametrize(
    ("consumed", "capacity"),
    [
        ({("ml", "x"): {"memory": 10.0}}, (("memory", 80.0),)),  # claim y not listed
        ({("ml", "x"): {"memory": 10.0}, ("ml", "y"): {"memory": 10.0}}, ()),  # no capacity
    ],
)
def test_an_unknown_part_makes_equal_parts_per_claim(consumed, capacity):
    holders = [holder("a", "x"), holder("b", "y"), holder("b2", "y")]
    shares, claims, basis = parts(holders, consumed, capacity)
    assert (claims, basis) == (2, "even")
    assert shares == pytest.approx((0.5, 0.25, 0.25))


def test_one_claims_pods_and_device_plugin_holders_are_left_to_usage():
    one_claim = [holder("a", "x"), holder("b", "x")]
    assert parts(one_claim, {("ml", "x"): {"memory": 8.0}}) is None
    mixed = [holder("a", "x"), Owner("ml", "p", "c")]
    assert parts(mixed, {("ml", "x"): {"memory": 8.0}}) is None
    assert parts([holder("a", "x")], {("ml", "x"): {"memory": 8.0}}) is None
