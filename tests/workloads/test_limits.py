"""The rate limiter every kube warning goes through, on a clock the test moves."""

from __future__ import annotations

import logging

from exporter.runtime.ratelimit import RateLimitedLog
from exporter.workloads.limits import Drops


def test_lines_per_minute_then_one_summary(caplog):
    now = [0.0]
    warn = RateLimitedLog(logging.getLogger("exporter.workloads.test"), 3, clock=lambda: now[0])
    logged = [warn.warning("bad ID %d", i) for i in range(10)]
    assert logged == [True] * 3 + [False] * 7
    now[0] = 59.9
    assert not warn.warning("still the same minute")
    now[0] = 60.0
    assert warn.warning("a new minute")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad ID 0",
        "bad ID 1",
        "bad ID 2",
        "8 more warnings like the above in the last minute were not logged",
        "a new minute",
    ]


def test_drops_count_by_input():
    d = Drops()
    d.add("pods", 3)
    d.add("pods")
    d.add("watch_line", 0)  # nothing dropped: no entry
    assert d.items() == [("pods", 4)] and d["watch_line"] == 0
