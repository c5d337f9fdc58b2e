"""A short soak in CI: 1,400 cycles of the full path with pod churn, MIG churn, XIDs
from NVML events and the kernel log (tests/reliability/soak.py), asserting that what
must stay flat does. The 100,000-cycle run and its numbers are in docs/reliability.md."""

from __future__ import annotations

from tests.reliability.soak import soak, summary

CYCLES = 1400
WARMUP = 400


async def test_soak_stays_flat():
    r = await soak(CYCLES, sample=100)
    s = summary(r, WARMUP)
    print(f"\nsoak: {s}")
    # no thread leaked: nothing is added over the run
    threads = [x.threads for x in r.window(WARMUP)]
    half = len(threads) // 2
    assert max(threads[half:]) <= max(threads[:half]), threads
    assert threads[-1] == threads[0], threads
    assert len(s["open_files"]) == 1, s["open_files"]
    assert s["rss_growth_mib"] < 3, s
    # the series count follows the MIG layouts (and XID counters changing owner with
    # the pods, a few series): the same range in the second half as in the first
    w = r.window(WARMUP)
    half = len(w) // 2
    first = {x.series for x in w[:half] if x.series}
    second = {x.series for x in w[half:] if x.series}
    assert max(second) <= max(first) + 10 and min(second) >= min(first) - 10, (first, second)
    assert r.failed_cycles == 0
    assert r.samples[-1].series > 0
    # every XID injected while events were watched is counted, none twice
    assert r.xid_counted == r.xid_injected > 0
    assert r.mig_changes == CYCLES // 50
