"""The self-metrics text written by hand is byte for byte what prometheus-client writes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from exporter.exposition.selfmetrics import SelfMetrics, text_of


class _Odd:
    def collect(self):
        g = GaugeMetricFamily(
            "odd_gauge", 'help with \\ and\nnewline and "quotes"', labels=["b", "a"]
        )
        g.add_metric(['va"l\\ue\nx', "ü"], 1e300)
        g.add_metric(["x", "y"], float("nan"))
        g.add_metric(["x", "z"], float("-inf"))
        g.add_metric(["y", "z"], 12345678.9)
        yield g
        c = CounterMetricFamily("odd", "a counter", labels=["k"])
        c.add_metric(["v"], 3)
        yield c
        yield GaugeMetricFamily("plain_gauge", "no labels", 0.1)


def _registry(*collectors):
    r = CollectorRegistry(auto_describe=False)
    for c in collectors:
        r.register(c)
    return r


def test_same_text_as_generate_latest():
    sm = SelfMetrics(1.0)
    sm.collections.update(success=3, failure=1)
    sm.nvml_errors = (("nvmlDeviceGetFanSpeed", "NOT_SUPPORTED", 8),)
    sm.registry.register(_Odd())
    want = generate_latest(sm.registry).decode()
    got = text_of(list(sm.registry.collect()))
    # process_* values move between the two calls (CPU seconds): compare without them
    strip = lambda t: [ln for ln in t.splitlines() if not ln.startswith("process_")]  # noqa: E731
    assert got is not None and strip(got) == strip(want)
    assert [ln.split(" ")[0] for ln in got.splitlines()] == [
        ln.split(" ")[0] for ln in want.splitlines()
    ]


def test_other_kinds_fall_back_to_prometheus_client():
    class _Info:
        def collect(self):
            i = InfoMetricFamily("build", "an info family")
            i.add_metric([], {"version": "1"})
            yield i

    assert text_of(list(_registry(_Info()).collect())) is None
    sm = SelfMetrics(1.0)
    sm.registry.register(_Info())
    assert 'build_info{version="1"} 1.0' in sm.render()
