"""End to end on the real exporter: dashboards answer on a node with MIG and shared GPUs.

The exporter runs on the simulated default node (``--simulate``: whole GPUs, GPU 1
time-sliced among three pods, GPU 5 shared by two MPS clients, GPUs 6 and 7 in MIG) with
``-k`` against the fake kubelet (tests/fixtures/kubelet/default-node.yaml), a fake API
server and a fixture host /proc (tests/fixtures/timeslice) for the shared GPUs' pods,
and its defaults otherwise (``-d f``: every device-level field of a MIG GPU once per GPU
instance). A real Prometheus scrapes it with the rule files of alerts/.

Then every panel and variable query of this repository's dashboards, and every query of
tests/dashboards/fixtures/dcgm-style-queries.yaml (written the way dcgm-exporter's users
write dashboards), returns data; and the recording rules count each GPU once where the
raw per-instance series would count a MIG GPU once per instance.

All of it under each release the exporter can mimic (--dcgm-exporter-version, with that
release's shipped metrics file): 4.8.2, 4.8.4, 4.9 and 4.10, whose new names and units our
dashboards and rules read as they are. Under 4.9 and 4.10 the dcgm-exporter-style queries are
asked as a team asks them once it moved its dashboards to the new names; the same queries
with the old names answer through alerts/migration/dcgm-4.8-names.rules.yaml, on a
second Prometheus that loads it.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.catalog.renames import renames
from tests.procs import ROOT, Exporter, Prometheus, http_get, require, wait_until
from tests.support.catalogs import EXTENDED
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TIMESLICE = ROOT / "tests" / "fixtures" / "timeslice"
STYLE = yaml.safe_load((FIXTURES / "dcgm-style-queries.yaml").read_text(encoding="utf-8"))
SCRAPE = "500ms"
# Grafana's built-in variables: rate windows of several scrapes, a range covering the run.
GRAFANA = {"$__rate_interval": "5s", "$__range_s": "60", "$__range": "1m"}
# This repository's dashboards with "All" selected everywhere.
OURS = {"cluster": ".*", "node": ".*", "gpu": ".*", "namespace": ".*", "pod": ".*"}
DEADLINE_S = 60.0
DEFAULT_ROWS = (ROOT / "exporter" / "catalog" / "metrics.csv").read_text()
# Panels that show faults, empty on this healthy node (they must still be valid PromQL).
# tests/e2e/test_alerting.py shows them with data on a node with injected faults.
HEALTHY_EMPTY = {
    "gpu-health.json: Firing alerts by GPU A": "no alert fires on a healthy node",
    "gpu-health.json: XID events A": "no XID on this node",
    "gpu-health.json: XIDs in the time range A": "no XID on this node",
    "gpu-health.json: Memory repair state E": "RETIRED_SBE: page retirement is pre-Ampere",
    "gpu-health.json: Memory repair state F": "RETIRED_DBE: page retirement is pre-Ampere",
    "gpu-health.json: Memory repair state G": "RETIRED_PENDING: page retirement is pre-Ampere",
    "gpu-health.json: NVML errors A": "no NVML call fails here but NOT_SUPPORTED ones",
    "gpu-health.json: NVLink errors E": "NVLink5's counters: Blackwell only, the node is H100",
    "gpu-health.json: NVLink errors F": "NVLink5's counters: Blackwell only, the node is H100",
}
# On the default node: 8 physical GPUs, 7 + 4 MIG instances on GPUs 6 and 7.
GPUS = 8
MIG_INSTANCES = 11


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "exporter", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "exporter"}}],
                "current-context": "fake",
            }
        ),
        encoding="utf-8",
    )
    return path


RELEASES = ("4.8.2", "4.8.4", "4.9", "4.10")
RULES = [
    ROOT / "alerts" / name
    for name in ("gpu-recording.rules.yaml", "gpu-alerts.rules.yaml", "gpu-accounting.rules.yaml")
]


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return request.param


def _start_prometheus(work: Path, port: int, rules: list[Path]) -> Prometheus:
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": [str(r) for r in rules],
        "scrape_configs": [
            {
                "job_name": "gpu-exporter",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {"node": "sim-node", "cluster": "lab"},
                    }
                ],
            }
        ],
    }
    work.mkdir(exist_ok=True)
    (work / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
    return Prometheus(work / "prometheus.yml", work)


@pytest.fixture(scope="module")
def exporter(release: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    require("prometheus", "prometheus")
    work = tmp_path_factory.mktemp(f"dcgm-queries-{release}")
    pods = [d for d in yaml.safe_load_all((TIMESLICE / "pods.yaml").read_text()) if d]
    with contextlib.ExitStack() as cleanup:
        node_pods = load_pods("default-node.yaml", fleet_ids(None))
        kubelet = FakeKubelet(work / "kubelet.sock", node_pods)
        kubelet.start()
        cleanup.callback(kubelet.close)
        api = FakeAPIServer(pods=pods).start()
        cleanup.callback(api.stop)
        exporter = Exporter(
            *("-c", "500", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path)),
            *("--host-proc", str(TIMESLICE / "proc"), "--dcgm-exporter-version", release),
            env={
                "KUBECONFIG": str(_kubeconfig(work / "kubeconfig", api.url)),
                "KUBERNETES_SERVICE_HOST": "",
            },
        )
        cleanup.callback(exporter.stop)
        exporter.wait_ready()
        yield exporter


@pytest.fixture(scope="module")
def prometheus(
    exporter: Exporter, release: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    prom = _start_prometheus(tmp_path_factory.mktemp(f"prom-{release}"), exporter.port, RULES)
    yield prom
    prom.stop()


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    for name, value in values.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"unset variable in {expr}"
    return expr


def _our_queries() -> list[tuple[str, str]]:
    """(where, expression) of every panel target and query variable of dashboards/*.json."""
    out = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        panels = []
        for panel in dashboard["panels"]:
            panels.append(panel)
            panels.extend(panel.get("panels", []))
        for panel in panels:
            for query in panel.get("targets", []):
                where = f"{path.name}: {panel['title']} {query['refId']}"
                out.append((where, _substitute(query["expr"], OURS)))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                where = f"{path.name}: ${variable['name']}"
                out.append((where, _substitute(variable["query"], OURS)))
    return out


def _as_served(expr: str, release: str) -> str:
    """A query as a team writes it for ``release``: the node label is ``hostname`` since
    4.8.3, 4.9 has DCGM 4.7's names, and 4.10 also its four byte rates' new names."""
    if release in ("4.9", "4.10"):
        for r in renames():
            if r.since == "4.9" or release == "4.10":
                expr = re.sub(rf"(?<![\w:]){r.old}(?![\w:])", r.new, expr)
    return expr if release == "4.8.2" else expr.replace("Hostname", "hostname")


def _style_queries(release: str = "4.8.2") -> list[tuple[str, str]]:
    """(where, expression) of every panel and variable of the dcgm-exporter-style fixture,
    under the names ``release`` serves."""
    out = []
    for board in STYLE["dashboards"]:
        values = dict.fromkeys(board.get("variables", {}), ".*") | board.get("values", {})
        for name, query in board.get("variables", {}).items():
            out.append((f"{board['name']}: ${name}", _substitute(query, values)))
        for panel in board["panels"]:
            out.append((f"{board['name']}: {panel['title']}", _substitute(panel["expr"], values)))
    return [(where, _as_served(expr, release)) for where, expr in out]


def _answer(prom: Prometheus, expr: str) -> list[Any]:
    """The result of a query, or of a label_values() variable (its values)."""
    label_values = re.fullmatch(r"label_values\((.+), (\w+)\)", expr)
    if not label_values:
        return prom.query(expr)
    selector, label = label_values.groups()
    params = urllib.parse.urlencode({"match[]": selector})
    status, _, body = http_get(f"{prom.url}/api/v1/label/{label}/values?{params}")
    assert status == 200, body
    return json.loads(body)["data"]


def _all_answer(prom: Prometheus, queries: list[tuple[str, str]]) -> None:
    for where, expr in queries:
        if where in HEALTHY_EMPTY:
            _answer(prom, expr)  # valid PromQL: Prometheus answers 200
    pending = {where: expr for where, expr in queries if where not in HEALTHY_EMPTY}
    deadline = time.monotonic() + DEADLINE_S
    while pending and time.monotonic() < deadline:
        for where, expr in list(pending.items()):
            if _answer(prom, expr):
                del pending[where]
        if pending:
            time.sleep(1)
    assert not pending, "queries without data:\n" + "\n".join(pending)


def test_the_fixture_has_the_shapes_dcgm_exporter_users_write() -> None:
    text = json.dumps(STYLE)
    for shape in (
        "instance=~",
        "by (Hostname",
        "by (UUID)",
        "by (modelName)",
        "by (GPU_I_PROFILE)",
        "GPU_I_ID",
        "by (namespace, pod)",
        'DCGM_FI_DEV_POWER_USAGE{pod=\\"$pod\\"}',
        "DCGM_FI_PROF_",
    ):
        assert shape in text, shape
    for name in ("GPU_UTIL", "FB_USED", "POWER_USAGE", "GPU_TEMP", "SM_CLOCK"):
        assert re.search(rf"(avg|sum|max)[^\n]*DCGM_FI_DEV_{name}", text), name


def test_every_query_of_our_dashboards_returns_data(prometheus: Prometheus) -> None:
    _all_answer(prometheus, _our_queries())


def _in_default(queries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The queries that read only rows of the default metrics file. Users' dashboards also
    read rows it leaves out (SM and FP16 activity, clock-event reasons, windowed counts):
    each of those must be a row of metrics-extended.csv, which serves them, and valid
    PromQL here."""
    old = {r.new: r.old for r in renames()}
    rows = {m.group(1) for m in re.finditer(r"^(DCGM_\w+),", DEFAULT_ROWS, re.M)}
    extended = {m.group(1) for m in re.finditer(r"^(DCGM_\w+),", EXTENDED.read_text(), re.M)}
    out = []
    for where, expr in queries:
        names = {old.get(n, n) for n in re.findall(r"\b(DCGM_(?:FI|EXP)_\w+)", expr)}
        if names <= rows:
            out.append((where, expr))
        else:
            assert names <= extended, (where, names - extended)
    return out


def test_every_dcgm_style_query_returns_data(prometheus: Prometheus, release: str) -> None:
    queries = _style_queries(release)
    for _, expr in queries:
        _answer(prometheus, expr)  # valid PromQL: Prometheus answers 200
    _all_answer(prometheus, _in_default(queries))


@pytest.mark.parametrize("release", ["4.9"], indirect=True)
def test_old_dcgm_style_queries_answer_under_4_9_through_the_migration_rules(
    exporter: Exporter, tmp_path: Path
) -> None:
    """A team that upgraded its exporters to 4.9's names before its dashboards."""
    migration = ROOT / "alerts" / "migration" / "dcgm-4.8-names.rules.yaml"
    prom = _start_prometheus(tmp_path, exporter.port, [*RULES, migration])
    try:
        style = _in_default(_style_queries("4.8.4"))
        old = [(w, e) for w, e in style if any(r.old in e for r in renames())]
        assert old
        _all_answer(prom, old)
    finally:
        prom.stop()


def test_mig_pods_answer_device_level_queries_by_pod(prometheus: Prometheus, release: str) -> None:
    small = _as_served('DCGM_FI_DEV_POWER_USAGE{pod="mig-small-0"}', release)
    wait_until(lambda: prometheus.query(small), 30, "MIG pods")
    power = prometheus.query(small)
    assert [(r["metric"]["gpu"], r["metric"]["GPU_I_ID"]) for r in power] == [("6", "7")]
    # GPU_CI_ID since 4.8.4: the compute instance of each MIG series (one per instance here)
    assert [r["metric"].get("GPU_CI_ID") for r in power] == [None if release == "4.8.2" else "0"]
    query = _as_served('DCGM_FI_DEV_GPU_TEMP{namespace="research", pod="mig-large"}', release)
    large = prometheus.query(query)
    assert [(r["metric"]["gpu"], r["metric"]["GPU_I_PROFILE"]) for r in large] == [("7", "3g.40gb")]


def _value(prom: Prometheus, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_recording_rules_count_each_gpu_once(prometheus: Prometheus, release: str) -> None:
    """The raw per-instance series count a MIG GPU once per instance; the rules do not."""
    wait_until(lambda: prometheus.query("node:gpu_energy_joules:rate5m"), 30, "the recording rules")
    raw_temp = _as_served('count(DCGM_FI_DEV_GPU_TEMP{job="gpu-exporter"})', release)
    assert _value(prometheus, raw_temp) == GPUS - 2 + MIG_INSTANCES
    assert _value(prometheus, "sum(node:gpu_devices:count)") == GPUS
    assert _value(prometheus, "sum(node:gpu_instances:count)") == GPUS - 2 + MIG_INSTANCES
    assert _value(prometheus, "sum(node_mig_profile:gpu_mig_instances:count)") == MIG_INSTANCES
    # Power: the rule equals the sum over physical GPUs, read at the same evaluation.
    per_gpu = _as_served(
        'sum(max by (UUID) (DCGM_FI_DEV_POWER_USAGE{job="gpu-exporter"}))', release
    )
    raw = _as_served('sum(DCGM_FI_DEV_POWER_USAGE{job="gpu-exporter"})', release)
    check = f"sum(node:gpu_power_watts:sum) - {per_gpu}"
    wait_until(lambda: abs(_value(prometheus, check)) < 1e-6, 10, "the power rule")
    assert _value(prometheus, raw) > _value(prometheus, per_gpu)
    # A MIG pod is not charged its whole GPU's power; a pod holding a whole GPU is.
    power = {
        r["metric"]["pod"]: float(r["value"][1])
        for r in prometheus.query("node_namespace_pod_container:gpu_power_watts:sum")
    }
    assert "train-0" in power and not any(pod.startswith("mig-") for pod in power)
