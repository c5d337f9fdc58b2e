"""Memory limits against the peaks `python3 -m benchmarks.memory` measured and wrote into
docs/benchmarks.md: each rendered DaemonSet's limit is at least 1.5 times the peak of every
variant it runs."""

from __future__ import annotations

import re

from benchmarks.memory import DOC, HEADROOM, VARIANTS, parse
from tests.deploy.conftest import COMPONENTS, EXCLUSIVE

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
# What each component adds to the variants the base runs (default and -k).
ADDS = {"shared-gpus": {"host-pid"}, "dra": {"api-watch", "dra"}}


def _variants(target: str) -> set[str]:
    comps = {target} if target in COMPONENTS else set()
    if target in ("all", "moved"):
        comps = set(COMPONENTS) - EXCLUSIVE
    out = {"default", "kubelet"}
    for c in comps:
        out |= ADDS.get(c, set())
    return out


def _mib(q: str) -> float:
    num, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q)).groups()
    return float(num) * UNITS[unit] / 2**20


def test_the_table_has_every_variant():
    assert set(parse(DOC.read_text())) == {v.name for v in VARIANTS}


def test_limits_leave_half_again_the_measured_peak(rendered):
    peaks = parse(DOC.read_text())
    for target, objs in rendered.items():
        (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        limit = _mib(c["resources"]["limits"]["memory"])
        for v in _variants(target):
            assert limit >= HEADROOM * peaks[v], f"{target}: {limit} MiB < 1.5 x {v} {peaks[v]}"
