"""DRA ResourceClaims whose devices are shared by consumable capacity (KEP-5075).

A device published with ``allowMultipleAllocations`` can be allocated to several
claims at once, each taking part of its capacity; the scheduler writes each claim's
part in ``status.allocation.devices.results[].consumedCapacity`` (a map from capacity
name to a quantity; resource.k8s.io v1, and v1beta1/v1beta2 alike). Only claims with
such a result are kept, at most ``limits.MAX_CLAIMS`` and ``MAX_RESULTS`` results each,
so memory is bounded however many claims the cluster has.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.workloads import limits
from exporter.workloads.limits import Drops

MAX_RESULTS = 32  # allocation results kept per claim (a claim allocates at most 32 devices)
MAX_QUANTITY_CHARS = 64
# a Kubernetes quantity: a decimal number, then a binary or decimal suffix or an exponent
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d{1,3})?")
_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SUFFIX |= {"P": 1e15, "E": 1e18}
_SUFFIX |= {f"{p}i": float(1 << (10 * (i + 1))) for i, p in enumerate("KMGTPE")}

Device = tuple[str, str, str]  # driver, pool, device name
Consumed = Mapping[str, float]  # capacity name -> amount the claim consumes


def quantity(v: Any) -> float | None:
    """A Kubernetes quantity ("40Gi", "500m", "1e3", 3) as a number; None if it is none."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if not isinstance(v, str) or len(v) > MAX_QUANTITY_CHARS:
        return None
    m = _QUANTITY.fullmatch(v.strip())
    if m is None:
        return None
    number, suffix = float(m.group(1)), m.group(2) or ""
    if suffix[:1] not in ("e", "E"):
        return number * _SUFFIX[suffix]
    exponent = int(suffix[1:])
    return number * 10.0**exponent if abs(exponent) <= 300 else None


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _text(v: Any) -> str:
    return v if isinstance(v, str) and len(v) <= limits.MAX_NAME_CHARS else ""


def capacities(raw: Any) -> tuple[tuple[str, float], ...]:
    """(name, amount) of a ResourceSlice device's ``capacity`` map ({name: {value: q}})."""
    out = []
    for name, cap in list(_map(raw).items())[:MAX_RESULTS]:
        amount = quantity(_map(cap).get("value"))
        if _text(name) and amount is not None and amount > 0:
            out.append((name, amount))
    return tuple(sorted(out))


def parse_claim(obj: Any, drops: Drops) -> tuple[tuple[str, str], dict[Device, Consumed]]:
    """((namespace, name), consumed capacity per device) of one ResourceClaim; the map is
    empty when no result of its allocation consumes capacity."""
    meta = _map(_map(obj).get("metadata"))
    allocation = _map(_map(_map(obj).get("status")).get("allocation"))
    results = _map(allocation.get("devices")).get("results")
    out: dict[Device, dict[str, float]] = {}
    for r in results if isinstance(results, list) else ():
        r = _map(r)
        consumed = _map(r.get("consumedCapacity"))
        if not consumed:
            continue
        if len(out) >= MAX_RESULTS:
            drops.add("claim_results")
            break
        dev = (_text(r.get("driver")), _text(r.get("pool")), _text(r.get("device")))
        got = out.setdefault(dev, {})
        for name, q in list(consumed.items())[:MAX_RESULTS]:
            amount = quantity(q)
            if _text(name) and amount is not None and amount >= 0:
                got[name] = got.get(name, 0.0) + amount  # two requests of one claim add up
    key = (_text(meta.get("namespace")), _text(meta.get("name")))
    return key, {d: MappingProxyType(c) for d, c in out.items()}


class ClaimIndex:
    """The consumed capacity of the claims that share devices; snapshots swapped whole."""

    def __init__(self, drops: Drops) -> None:
        self.drops = drops
        self._claims: Mapping[tuple[str, str], dict[Device, Consumed]] = MappingProxyType({})

    def consumed(self, namespace: str, name: str, device: Device) -> Consumed | None:
        """What claim ``namespace/name`` consumes of ``device``; None if not known."""
        got = self._claims.get((namespace, name))
        return None if got is None else got.get(device)

    def __len__(self) -> int:
        return len(self._claims)

    def replace(self, items: Iterable[Any]) -> None:
        """Replace every claim with those of a list answer."""
        claims: dict[tuple[str, str], dict[Device, Consumed]] = {}
        for obj in items:
            self._put(claims, obj)
        self._claims = MappingProxyType(claims)

    def event(self, kind: str, obj: Any) -> None:
        """Apply one watch event (ADDED, MODIFIED or DELETED)."""
        claims = dict(self._claims)
        key, _ = parse_claim(obj, Drops())
        claims.pop(key, None)
        if kind != "DELETED":
            self._put(claims, obj)
        self._claims = MappingProxyType(claims)

    def _put(self, claims: dict[tuple[str, str], dict[Device, Consumed]], obj: Any) -> None:
        key, devices = parse_claim(obj, self.drops)
        if not devices or not all(key):
            return  # nothing shared by capacity: the claim's device is its own
        if len(claims) >= limits.MAX_CLAIMS:
            self.drops.add("claims")
            return
        claims[key] = devices
