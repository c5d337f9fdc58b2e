"""The self-metrics text is byte for byte what prometheus-client writes for the same families,
and the process metrics are the ones its ProcessCollector reports for this process."""

from __future__ import annotations

import math
import resource
import string
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporter.exposition.selfmetrics import SelfMetrics
from exporter.exposition.selftext import Family, ProcessMetrics, Texts, go_float, text

ROOT = Path(__file__).parents[2]
_FIRST = string.ascii_letters + "_"
_REST = _FIRST + string.digits
names = st.builds(lambda a, b: a + b, st.sampled_from(_FIRST), st.text(_REST, max_size=12))
# what generate_latest writes unescaped: a counter named x_total is renamed by prometheus-client
metric_names = names.filter(lambda n: not n.endswith(("_total", "_created")))
texts = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ['a "quoted" \\ back\nslash', "ü€😀", "\\n", ""]
)
values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([float("nan"), -0.0, 1e21, 1e-7, 1e6, 1234567.0, 12345678.9, 2.0**70])
    | st.integers(-(2**80), 2**80).map(float)
    | st.integers(0, 10**9)
)


@st.composite
def families(draw):
    kind = draw(st.sampled_from(["gauge", "counter"]))
    labels = draw(st.lists(names, max_size=4, unique=True))
    rows = draw(
        st.lists(
            st.tuples(st.lists(texts, min_size=len(labels), max_size=len(labels)), values),
            max_size=4,
        )
    )
    return kind, draw(metric_names), draw(texts), labels, rows


def _theirs(specs) -> str:
    class _Collector:
        def collect(self):
            for kind, name, doc, labels, rows in specs:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                m = cls(name, doc, labels=labels)
                for vals, v in rows:
                    m.add_metric(vals, v)
                yield m

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector())
    return generate_latest(reg).decode()


def _ours(specs) -> str:
    out = []
    for kind, name, doc, labels, rows in specs:
        f = Family(name, doc, labels=labels, kind=kind)
        for vals, v in rows:
            f.add(vals, v)
        out.append(f)
    return text(out)


@settings(max_examples=300, deadline=None)
@given(st.lists(families(), max_size=4, unique_by=lambda f: f[1]))
def test_same_text_as_generate_latest(specs):
    assert _ours(specs) == _theirs(specs)


@settings(max_examples=500, deadline=None)
@given(values)
def test_values_written_as_prometheus_client_writes_them(v):
    assert go_float(v) == floatToGoString(v)


def test_value_formats_users_see():
    cases = {
        float("inf"): "+Inf",
        float("-inf"): "-Inf",
        float("nan"): "NaN",
        1: "1.0",
        -0.0: "-0.0",
        0.1: "0.1",
        1e6: "1e+06",
        12345678.9: "1.23456789e+07",
        1e21: "1e+21",
        1e-7: "1e-07",
        -1234567.0: "-1234567.0",
    }
    assert {v: go_float(v) for v in cases} == cases


def test_labelled_gauge_and_counter_text():
    g = Family("odd_gauge", 'help with \\ and\nnewline and "quotes"', labels=["b", "a"])
    g.add(['va"l\\ue\nx', "ü"], 1e300)
    c = Family("odd", "a counter", labels=["k"], kind="counter")
    c.add(["v"], 3)
    assert text([g, c]) == (
        '# HELP odd_gauge help with \\\\ and\\nnewline and "quotes"\n'
        "# TYPE odd_gauge gauge\n"
        'odd_gauge{a="ü",b="va\\"l\\\\ue\\nx"} 1e+300\n'
        "# HELP odd_total a counter\n"
        "# TYPE odd_total counter\n"
        'odd_total{k="v"} 3.0\n'
    )


def _parsed(t: str) -> dict[str, tuple[str, str, float]]:
    """name -> (type, help, value) of the label-less families in ``t``."""
    return {
        f.name: (f.type, f.documentation, f.samples[0].value)
        for f in text_string_to_metric_families(t)
    }


def test_process_metrics_match_process_collector():
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    theirs_text = generate_latest(reg).decode()
    ours_text = text(ProcessMetrics().families())
    header = lambda t: [ln for ln in t.splitlines() if ln.startswith("#")]  # noqa: E731
    assert header(ours_text) == header(theirs_text)
    ours, theirs = _parsed(ours_text), _parsed(theirs_text)
    assert set(ours) == {
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_cpu_seconds",
        "process_open_fds",
        "process_max_fds",
    }
    value = {n: (ours[n][2], theirs[n][2]) for n in ours}
    mib = 1024 * 1024
    assert (
        abs(value["process_resident_memory_bytes"][0] - value["process_resident_memory_bytes"][1])
        < 4 * mib
    )
    assert (
        abs(value["process_virtual_memory_bytes"][0] - value["process_virtual_memory_bytes"][1])
        < 64 * mib
    )
    assert abs(value["process_cpu_seconds"][0] - value["process_cpu_seconds"][1]) < 0.5
    assert abs(value["process_start_time_seconds"][0] - value["process_start_time_seconds"][1]) < 1
    assert abs(value["process_open_fds"][0] - value["process_open_fds"][1]) <= 3
    assert value["process_max_fds"][0] == value["process_max_fds"][1]
    assert value["process_max_fds"][0] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_process_metrics_left_out_where_proc_cannot_be_read(tmp_path):
    assert ProcessMetrics(str(tmp_path)).families() == []  # no /proc/stat: no boot time
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (tmp_path / "self").mkdir()
    assert ProcessMetrics(str(tmp_path)).families() == []  # no stat, fd or limits of its own


def test_selfmetrics_render_is_valid_and_starts_with_process_metrics():
    sm = SelfMetrics(15.0)
    sm.collections.update(success=3, failure=1)
    sm.nvml_errors = (("nvmlDeviceGetFanSpeed", "NOT_SUPPORTED", 8),)
    got = sm.render()
    fams = {f.name: f for f in text_string_to_metric_families(got)}
    assert got.startswith("# HELP process_virtual_memory_bytes ")
    assert fams["gpu_exporter_collect_interval_seconds"].samples[0].value == 15.0
    by_result = {s.labels["result"]: s.value for s in fams["gpu_exporter_collections"].samples}
    assert by_result == {"success": 3.0, "failure": 1.0, "skipped": 0.0}
    errors = fams["gpu_exporter_nvml_errors"].samples
    assert [(s.labels, s.value) for s in errors] == [
        ({"function": "nvmlDeviceGetFanSpeed", "code": "NOT_SUPPORTED"}, 8.0)
    ]
    assert math.isclose(
        fams["process_start_time_seconds"].samples[0].value,
        ProcessMetrics().families()[2].samples[0][1],
    )


def test_exporter_runs_without_prometheus_client():
    """prometheus-client is a test dependency only: nothing the exporter imports pulls it in."""
    code = (
        "import sys, exporter.app, exporter.cli, exporter.kube.podresources; "
        "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_text_kept_across_renders_follows_each_value():
    # neighbours compare equal (or are NaN) yet some are written apart: 0.0 and -0.0
    kept = Texts()
    for v in (0, 0.0, -0.0, 0.0, False, 1, 1.0, True, float("nan"), float("nan"), 2.5, 2.5):
        fams = [Family("a", "help", v), Family("b", "help", 7, labels=["x"])]
        fams[1].add(["y"], v)
        assert kept(fams) == text(fams), v
