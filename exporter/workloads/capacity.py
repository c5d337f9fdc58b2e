"""Shares of a DRA device that several claims hold by consumable capacity (KEP-5075).

A device published with ``allowMultipleAllocations`` sits under several independent
claims (across namespaces too); the scheduler gives each claim part of the device's
capacity (its allocation result's ``consumedCapacity``). A claim's weight is what it
consumes over what the device has: for a device with several capacities (memory,
compute, ...) the mean of those ratios, so the weights of all claims add up to at most
1 and the rest of the device stays unallocated. The containers holding one claim
share its weight evenly. When a claim's consumption or the device's capacity is not
known (the claim not yet listed, no capacity published), every claim gets an even
part instead (basis "even"); a device one claim holds is left to workloads/usage.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from exporter.frame import Owner

Parts = tuple[tuple[float, ...], int, str]
"""Each holder's part of a device (0..1, in the holders' order), the claims they are
over and the basis: "capacity" (consumed over capacity) or "even"."""
Consumed = Callable[[str, str, tuple[str, str, str]], Mapping[str, float] | None]
"""(claim namespace, claim name, (driver, pool, device)) -> what it consumes, by name."""
SliceDevice = Callable[[str, str, str], Any]
"""(driver, pool, device) -> the ResourceSlice device (apiserver/slices.py), or None."""


def claim_parts(
    owners: Mapping[str, tuple[Owner, ...]], consumed: Consumed, device: SliceDevice
) -> dict[str, Parts]:
    """The parts of every device that two or more DRA claims hold, by device key."""
    out = {}
    for key, holders in owners.items():
        if len(holders) < 2 or not all(o.claim for o in holders):
            continue
        groups: dict[tuple[str, str], int] = {}
        for o in holders:
            groups[(o.claim_namespace, o.claim)] = groups.get((o.claim_namespace, o.claim), 0) + 1
        if len(groups) < 2:
            continue  # one claim's pods: an even split (usage.shares)
        weights = _weights(holders, groups, consumed, device)
        if weights is None:
            even = 1.0 / len(groups)
            parts = tuple(even / groups[(o.claim_namespace, o.claim)] for o in holders)
            out[key] = (parts, len(groups), "even")
            continue
        parts = tuple(
            weights[(o.claim_namespace, o.claim)] / groups[(o.claim_namespace, o.claim)]
            for o in holders
        )
        out[key] = (parts, len(groups), "capacity")
    return out


def _weights(
    holders: tuple[Owner, ...],
    groups: Mapping[tuple[str, str], int],
    consumed: Consumed,
    device: SliceDevice,
) -> dict[tuple[str, str], float] | None:
    """Each claim's consumed over the device's capacity; None when any is not known."""
    o = holders[0]
    dev = device(o.driver, o.pool, o.device)
    capacity = getattr(dev, "capacity", ())
    if not capacity:
        return None
    out = {}
    for ns, name in groups:
        got = consumed(ns, name, (o.driver, o.pool, o.device))
        if got is None:
            return None
        out[(ns, name)] = sum(min(got.get(c, 0.0) / amount, 1.0) for c, amount in capacity)
        out[(ns, name)] /= len(capacity)
    total = sum(out.values())
    if total > 1.0:  # the scheduler keeps it at 1 at most; a stale claim may not
        out = {k: w / total for k, w in out.items()}
    return out
