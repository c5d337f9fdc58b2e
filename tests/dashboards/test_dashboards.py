"""Static checks of dashboards/*.json in the spirit of Grafana's dashboard linter.

One templated Prometheus data source used everywhere, an `__inputs` entry for UI import
that provisioning can ignore, current panel types, a unit and a description on every
panel, $__rate_interval in rate(), counters only through rate/increase, unique ids, no
overlapping panels, and only metrics the exporter serves (on the simulator, in process) or
the recording rules record.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.catalog.renames import renames
from exporter.collector import Collector
from exporter.config.model import default_metrics_file
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.frame import DeviceUse, KubeStatus, Owner, Split
from exporter.sim import Fault, ManualClock
from tests.support.exposition import Stages

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 41
PANEL_TYPES = {"timeseries", "stat", "table", "state-timeline", "bargauge", "gauge", "row"}
# Grafana unit ids used here (from Grafana's value format categories).
UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "Bps", "watt", "kwatth", "celsius",
    "hertz", "s", "cps", "cpm", "bool_yes_no",
}  # fmt: skip
VARIABLES = {
    "gpu-fleet.json": {"cluster", "node", "gpu"},
    "gpu-health.json": {"cluster", "node", "gpu"},
    "gpu-workloads.json": {"cluster", "node", "namespace", "pod"},
    "gpu-accounting.json": {"cluster", "namespace", "pod"},
}
RULE_FILES = ("gpu-recording.rules.yaml", "gpu-accounting.rules.yaml")
GRAFANA_VARIABLES = {"__rate_interval", "__range", "__range_s", "datasource"}
# Counters whose names do not end in _total; the remapped-row counts are shown as totals
# on purpose (rows remapped over the GPU's life), so they are not listed, under either name.
COUNTERS = re.compile(
    r"\b(\w+_total|(?!DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL\b|DCGM_FI_DEV_ROW_REMAP_\w+_TOTAL\b)"
    r"\w+_TOTAL|DCGM_FI_DEV_\w+_VIOLATION"
    r"|DCGM_FI_DEV_PCIE_REPLAY_COUNTER|DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)\b"
)
# Throughputs DCGM computes from two samples (docs/compatibility.md): never rate() them.
RATES = re.compile(r"\b(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL|DCGM_FI_DEV_PCIE_[TR]X_THROUGHPUT)\b")
METRIC = re.compile(r"\b(DCGM_\w+|gpu_exporter_\w+|\w+:\w+:\w+|ALERTS)\b")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every panel target."""
    return [
        (panel["title"], query["expr"])
        for panel in _panels(dashboard)
        for query in panel.get("targets", [])
    ]


@functools.cache
def _served_on_the_simulator() -> frozenset[str]:
    """Family names the exporter serves with the shipped metrics file as it is (the
    dashboards read nothing it leaves out: test_default_rows.py), on the simulated nodes:
    the default node, the mixed one (older GPUs serve retired pages), the GB200 one
    (NVLink5 counters), after an XID, with
    pod attribution, a time-sliced GPU shared by two containers and memory no pod
    accounts for."""
    catalog = load(default_metrics_file())
    names: set[str] = set()
    fleets = REPO / "exporter" / "sim" / "fleets"
    for fleet in (None, fleets / "mixed.yaml", fleets / "gb200.yaml"):
        clock = ManualClock()
        driver = sim.install(fleet, clock=clock)
        col = Collector(catalog, "node-a")
        try:
            status = KubeStatus(True, True, (("nvidia.com/gpu", 1),), 2, (), 0)
            builder = Stages(selfmetrics=SelfMetrics(1.0, lambda status=status: status))
            snap = col.collect()
            driver.inject(Fault("xid", gpu=0, xid=13))
            deadline = time.monotonic() + 10
            while not (col.xid and col.xid.state().counts) and time.monotonic() < deadline:
                time.sleep(0.02)
            clock.advance(1.0)
            snap = col.collect()
            a, b = Owner("ns", "a", "c"), Owner("ns", "b", "c")
            shared = Split(snap.gpus[0], {a: 100.0, b: 0.0}, {a: 5.0, b: 0.0})
            builder.builder.selfmetrics.snapshot = snap
            # a process no pod accounts for on GPU 1 (a dead pod's leftovers)
            stray = DeviceUse(unaccounted_bytes=1 << 30, unaccounted_processes=1)
            builder.publish(snap, catalog, splits=[shared], uses={snap.gpus[1].key: stray})
            text = builder.builder.build().plain.decode()
        finally:
            col.close()
            sim.uninstall()
        names |= {f.name for f in text_string_to_metric_families(text)}
        names |= set(re.findall(r"^# TYPE (\S+)", text, re.M))  # counters: with _total
    return frozenset(names)


def _known_metrics() -> set[str]:
    recorded = {
        rule["record"]
        for name in RULE_FILES
        for group in yaml.safe_load((REPO / "alerts" / name).read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    served = set(_served_on_the_simulator())
    # a served field's DCGM 4.7 name: served instead under --dcgm-exporter-version 4.9
    renamed = {r.new for r in renames() if r.old in served}
    return served | renamed | recorded | {"ALERTS"}


@pytest.fixture(params=FILES, ids=[path.name for path in FILES])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    data = _load(request.param)
    data["_file"] = request.param.name
    return data


def test_the_dashboards_exist() -> None:
    assert [path.name for path in FILES] == sorted(VARIABLES)


def test_dashboards_are_generated_and_current() -> None:
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_uids_and_titles_are_unique() -> None:
    dashboards = [_load(path) for path in FILES]
    assert len({d["uid"] for d in dashboards}) == len(dashboards)
    assert len({d["title"] for d in dashboards}) == len(dashboards)


def test_schema_version_and_id(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] == SCHEMA_VERSION
    assert dashboard["id"] is None, "exported dashboards carry no database id"
    assert dashboard["description"]
    assert "gpu-exporter" in dashboard["tags"]


def test_one_templated_prometheus_data_source(dashboard: dict[str, Any]) -> None:
    variables = dashboard["templating"]["list"]
    sources = [v for v in variables if v["type"] == "datasource"]
    assert len(sources) == 1
    assert sources[0]["name"] == "datasource" and sources[0]["query"] == "prometheus"
    for variable in variables:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for query in panel["targets"]:
            assert query["datasource"] == DATASOURCE, panel["title"]


def test_datasource_works_imported_and_provisioned(dashboard: dict[str, Any]) -> None:
    """No ${DS_...} placeholder anywhere: Grafana's sidecar and file provisioning substitute
    none. The data source variable has no current value, so Grafana selects the default
    Prometheus data source, whether the JSON is imported in the UI or provisioned."""
    assert "__inputs" not in dashboard
    assert "${DS_" not in json.dumps(dashboard)
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["name"] == "datasource" and source["query"] == "prometheus"
    assert not source["current"]


def test_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == VARIABLES[dashboard["_file"]]
    for name, variable in variables.items():
        assert variable["refresh"] == 2, f"{name}: refresh on time range change"
        assert re.fullmatch(r"label_values\(.+, \w+\)", variable["query"]), name
        assert variable["includeAll"] and variable["allValue"] == ".*", name
    queries = " ".join(expr for _, expr in _queries(dashboard))
    for name in variables:
        assert f"${name}" in queries, f"variable {name} is unused"
    used = queries + " ".join(v["query"] for v in variables.values())
    for name in set(re.findall(r"\$(\w+)", used)):
        assert name in variables or name in GRAFANA_VARIABLES, f"undefined variable ${name}"


def test_panel_types_titles_descriptions_and_units(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"].strip()
        if panel["type"] == "row":
            continue
        assert panel.get("description", "").strip(), f"{panel['title']}: no description"
        assert panel["targets"], f"{panel['title']}: no query"
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, panel["title"]
        for override in panel["fieldConfig"]["overrides"]:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in UNITS, panel["title"]
        if panel["type"] == "table":
            for query in panel["targets"]:
                assert query["instant"] and query["format"] == "table", panel["title"]


def test_ids_are_unique_and_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    panels = _panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    refs = [[q["refId"] for q in p.get("targets", [])] for p in panels]
    assert all(len(r) == len(set(r)) for r in refs)
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_rates_use_rate_interval(dashboard: dict[str, Any]) -> None:
    for title, expr in _queries(dashboard):
        for window in re.findall(r"\b(?:rate|irate)\([^\[]*\[([^\]]*)\]", expr):
            assert window == "$__rate_interval", f"{title}: {expr}"


def test_counters_only_through_rate_or_increase(dashboard: dict[str, Any]) -> None:
    for title, expr in _queries(dashboard):
        for match in COUNTERS.finditer(expr):
            before = expr[: match.start()]
            assert re.search(r"\b(rate|irate|increase)\(\s*$", before), f"{title}: {expr}"
        for match in RATES.finditer(expr):
            before = expr[: match.start()]
            assert not re.search(r"\b(rate|irate|increase)\(\s*$", before), f"{title}: {expr}"


def test_queries_use_only_served_or_recorded_metrics(dashboard: dict[str, Any]) -> None:
    known = _known_metrics()
    queries = _queries(dashboard) + [
        (v["name"], v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    for title, expr in queries:
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), title
        for name in METRIC.findall(expr):
            assert name in known, f"{title}: unknown metric {name}"


def test_legends_show_the_host_in_either_spelling(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        for query in panel.get("targets", []):
            legend = query.get("legendFormat", "")
            if "Hostname" in legend or "hostname" in legend:
                assert "{{Hostname}}{{hostname}}" in legend, panel["title"]


# a series by name; or by __name__ (label_values of either name of a renamed field)
OWN_SERIES = re.compile(
    r"(?<![\w:\"|])(DCGM_\w+|gpu_exporter_\w+|up)\b(\{[^}]*\})?|(\{__name__=~\"DCGM_[^}]*\})"
)


def test_queries_read_the_configured_job_only(dashboard: dict[str, Any]) -> None:
    """As the rules do (alerts/config.yaml): a second exporter doubles no panel."""
    job = yaml.safe_load((REPO / "alerts" / "config.yaml").read_text())["job"]
    variables = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    exprs = [expr for _, expr in _queries(dashboard)] + variables
    assert exprs
    for expr in exprs:
        for m in OWN_SERIES.finditer(expr):
            selector = m.group(2) or m.group(3)
            assert selector and f'job=~"{job}"' in selector, (m.group(0), expr)


# sum/count/avg applied straight to a series (or its rate): over a MIG GPU's per-instance
# copies of a device-level field (-d f) it would count the GPU once per instance.
AGGREGATED = re.compile(
    r"\b(?:sum|count|avg)(?:\s+by\s*\([^)]*\))?\s*\(\s*(?:(?:rate|irate|increase)\(\s*)?"
    r"(DCGM_FI_DEV_\w+)(\{[^}]*\})?"
)


def _device_level() -> set[str]:
    from exporter.nvml.fields import FIELDS, Scope

    return {name for name, field in FIELDS.items() if field.scope == Scope.DEVICE}


def _summed_device_fields(expr: str, device: set[str]) -> list[str]:
    """Device-level fields aggregated without first taking one series per GPU."""
    return [
        m.group(0)
        for m in AGGREGATED.finditer(expr)
        if m.group(1) in device and 'GPU_I_ID=""' not in (m.group(2) or "")
    ]


def test_summed_device_fields_are_caught() -> None:
    device = _device_level()
    assert "DCGM_FI_DEV_POWER_USAGE" in device and "DCGM_FI_DEV_FB_USED" not in device
    assert _summed_device_fields("sum by (node) (DCGM_FI_DEV_POWER_USAGE)", device)
    assert _summed_device_fields("count(rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]))", device)
    assert not _summed_device_fields("sum(max by (UUID) (DCGM_FI_DEV_POWER_USAGE))", device)
    assert not _summed_device_fields('sum(DCGM_FI_DEV_GPU_UTIL{GPU_I_ID=""})', device)
    assert not _summed_device_fields("sum(DCGM_FI_DEV_FB_USED)", device)


def test_device_fields_count_each_gpu_once() -> None:
    """Dashboards and recording rules take a MIG GPU's per-instance copies once (max by)."""
    device = _device_level()
    rules = yaml.safe_load((REPO / "alerts/gpu-recording.rules.yaml").read_text())["groups"]
    exprs = [(r["record"], r["expr"]) for group in rules for r in group["rules"]]
    for path in FILES:
        exprs += [(f"{path.name}: {title}", expr) for title, expr in _queries(_load(path))]
    found = {where: bad for where, expr in exprs if (bad := _summed_device_fields(expr, device))}
    assert found == {}
