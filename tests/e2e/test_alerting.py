"""End to end: faults on a simulated node reach a webhook through the shipped rules and
routing, a healthy node raises nothing, and every dashboard query has data.

Two exporters (``--simulate``, each with ``-k`` against its own fake kubelet) play two
nodes of one cluster: tests/fixtures/fleets/alerting-faulty.yaml (an XID 79 and the GPU
lost, double-bit ECC errors, three overheating GPUs, one of them in MIG mode, a GPU at
its power and memory limits, application XIDs, an idle allocation) and
alerting-healthy.yaml (the same GPUs and pods, no faults). One real Prometheus scrapes
both with the rule files of alerts/ and sends to one real Alertmanager configured with
alerts/alertmanager.yaml, which delivers to a webhook served by this process. What must
arrive is tests/fixtures/alerting/expected.yaml.

Prometheus and Alertmanager load copies of the shipped files, changed only where a test
cannot wait:

- every ``for:`` becomes FOR: the shipped ones (2 minutes to 3 hours) are longer than a
  test can run.
- every rate() window is read in seconds instead of minutes ([5m] -> [5s]): rate()
  divides by the whole window, so over a history of seconds a [5m] window reads the
  rate low by that ratio and the throttling alerts would never cross their thresholds.
  The other windows stay as shipped: increase() > 0, avg_over_time() and ``offset``
  give the same answer over a short history.
- the subquery of GPUNodeGPUCountDropped (``[6h:5m]``) is read at a 1 s resolution: its
  points sit on the wall clock's 5-minute boundaries, so in a run shorter than that
  whether it sees the GPU count from before the loss depends on the time of day.
- Alertmanager: every receiver's URL points at the webhook (one path per receiver), and
  group_wait and group_interval are 1 s. Routes, grouping and inhibitions are as shipped.

The same Prometheus then serves the dashboard tests: every panel query of dashboards/*.json,
with Grafana's variables set for the faulty node, must return data.

GPU 0 (XID 79, then lost) is held by a pod: its XID counter keeps the pod's labels after
the GPU falls off the bus, so the alert names the workload that lost its GPU.

Not covered here, and covered by the promtool unit tests in alerts/tests/ instead:
GPUDisappeared needs a GPU seen 30 to 90 minutes ago (``offset 30m``), so it is loaded but
cannot fire in a test run; GPUExporterMissing and GPUNodeAllocatableBelowCapacity need
kube-state-metrics; the simulator has no fault for a row-remap failure, NVLink or PCIe
errors (GPURowRemapFailure, GPUNVLinkErrors, GPUPCIeReplayErrors); losing NVML or
failing collections (GPUExporterNVMLDown, GPUExporterCollectionFailing, ...) would
silence the node's other alerts. Those alerts are loaded all the same and must stay
silent: the faulty node delivers exactly the expected set, the healthy node nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import ROOT, Exporter, Prometheus, free_port, http_get, require, wait_until
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

FLEETS = ROOT / "tests" / "fixtures" / "fleets"
FIXTURES = ROOT / "tests" / "fixtures" / "alerting"
ALERTS = ROOT / "alerts"
EXPECTED = yaml.safe_load((FIXTURES / "expected.yaml").read_text(encoding="utf-8"))
CLUSTER = EXPECTED["cluster"]
FAULTY = EXPECTED["node"]
HEALTHY = "gpu-node-healthy"
NODES = {FAULTY: FLEETS / "alerting-faulty.yaml", HEALTHY: FLEETS / "alerting-healthy.yaml"}

FOR = "3s"
SCRAPE = "500ms"
# Collecting every second, scraped twice as often: the newest collection Prometheus holds
# is at most 1.5 s old, well inside GPUExporterCollectionStale's three intervals.
COLLECT_MS = "1000"
GROUP_TIMING = "1s"
# After the last expected notification, how long nothing else may arrive: longer than
# FOR plus group_wait, so an alert that started pending with the faults would show.
QUIET_S = 5.0
# Everything expected arrives within this many seconds of the exporters' start (the
# faults come at 12 s, Prometheus's first scrape at about 6 s; all is delivered by about
# 20 s).
DELIVERY_DEADLINE_S = 60.0


def _fault_time(fleet: Path) -> float:
    faults = yaml.safe_load(fleet.read_text(encoding="utf-8")).get("faults", [])
    return min(f["at"] for f in faults)


# ---- test copies of the shipped configuration --------------------------------------------


_FOR = re.compile(r"^(\s+for:) \S+$", re.M)
_RATE_WINDOW = re.compile(r"(\brate\([^()\[\]]*\[)(\d+)m\]")
_SUBQUERY = re.compile(r"\[(\w+):\w+\]")


def scaled_expr(expr: str) -> str:
    """An expression with rate() windows in seconds and subqueries at a 1 s resolution."""
    return _SUBQUERY.sub(r"[\1:1s]", _RATE_WINDOW.sub(r"\g<1>\2s]", expr))


def scaled_rules(text: str) -> str:
    """A rule file with every `for:` set to FOR and its expressions scaled."""
    return scaled_expr(_FOR.sub(rf"\1 {FOR}", text))


def alertmanager_config(webhook: str) -> dict[str, Any]:
    """alerts/alertmanager.yaml with receivers pointed at `webhook` and short group timings."""
    config = yaml.safe_load((ALERTS / "alertmanager.yaml").read_text(encoding="utf-8"))

    def walk(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = GROUP_TIMING
        for child in route.get("routes", []):
            walk(child)

    walk(config["route"])
    for receiver in config["receivers"]:
        assert set(receiver) == {"name", "webhook_configs"}, "only webhooks can be redirected"
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"{webhook}/{receiver['name']}"
    return config


def test_test_copies_change_only_the_timings() -> None:
    for name in ("gpu-alerts.rules.yaml", "gpu-recording.rules.yaml"):
        shipped = yaml.safe_load((ALERTS / name).read_text(encoding="utf-8"))["groups"]
        text = scaled_rules((ALERTS / name).read_text(encoding="utf-8"))
        copy = yaml.safe_load(text)["groups"]
        pairs = [
            (a, b)
            for g, h in zip(shipped, copy, strict=True)
            for a, b in zip(g["rules"], h["rules"], strict=True)
        ]
        for a, b in pairs:
            assert b.get("for") == (FOR if "for" in a else None)
            assert b["expr"] == scaled_expr(a["expr"])
            assert {k: v for k, v in a.items() if k not in ("for", "expr")} == {
                k: v for k, v in b.items() if k not in ("for", "expr")
            }
    shipped_text = (ALERTS / "gpu-alerts.rules.yaml").read_text(encoding="utf-8")
    # A new kind of window: check how it reads over a short history before adding it.
    assert _SUBQUERY.findall(shipped_text) == ["6h"]
    assert {m.group(2) for m in _RATE_WINDOW.finditer(shipped_text)} == {"5", "10"}

    def timings_and_urls_blanked(config: dict[str, Any]) -> str:
        text = re.sub(r'"(group_wait|group_interval)": "\w+"', r'"\1": ""', json.dumps(config))
        return re.sub(r'"url": "[^"]*"', '"url": ""', text)

    shipped_am = yaml.safe_load((ALERTS / "alertmanager.yaml").read_text(encoding="utf-8"))
    assert timings_and_urls_blanked(alertmanager_config("http://hook")) == (
        timings_and_urls_blanked(shipped_am)
    )


# ---- the processes -----------------------------------------------------------------------


class Webhook:
    """Records every notification POSTed to it: (path without '/', JSON payload)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with hook.lock:
                    hook.notifications.append((self.path.lstrip("/"), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return list(self.notifications)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    """A real Alertmanager on a free port, clustering off."""

    def __init__(self, config: Path, workdir: Path) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            pytest.skip(
                "prometheus-alertmanager not installed: apt-get install "
                "prometheus-alertmanager (.ci/run does)"
            )
        self.address = f"127.0.0.1:{free_port()}"
        self.url = f"http://{self.address}"
        self.logfile = workdir / "alertmanager.log"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={workdir / 'alertmanager'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",
            ],
            stdout=self.logfile.open("w"),
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            assert self.proc.poll() is None, self.logfile.read_text()
            return http_get(self.url + "/-/ready", timeout=1)[0] == 200

        wait_until(ready, 30, "Alertmanager ready")

    def alerts(self) -> list[dict[str, Any]]:
        query = "active=true&silenced=true&inhibited=true&unprocessed=true"
        status, _, body = http_get(f"{self.url}/api/v2/alerts?{query}")
        assert status == 200, body
        return json.loads(body)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Stack:
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook
    uuids: dict[str, dict[str, str]]  # node -> GPU index -> UUID
    started: float  # time.monotonic() when the exporters started

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus.url}{path}?{urllib.parse.urlencode(params)}"
        status, _, body = http_get(url)
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", body
        return answer["data"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("alerting")
    with contextlib.ExitStack() as cleanup:
        webhook = Webhook()
        cleanup.callback(webhook.close)
        (work / "alertmanager.yml").write_text(
            yaml.safe_dump(alertmanager_config(webhook.url)), encoding="utf-8"
        )
        alertmanager = Alertmanager(work / "alertmanager.yml", work)
        cleanup.callback(alertmanager.stop)

        uuids: dict[str, dict[str, str]] = {}
        exporters: dict[str, Exporter] = {}
        started = time.monotonic()
        for node, fleet in NODES.items():
            ids = fleet_ids(fleet)
            uuids[node] = {k.split(":")[1]: v for k, v in ids.items() if k.startswith("gpu:")}
            pods = load_pods(str(FIXTURES / "kubelet.yaml"), ids)
            kubelet = FakeKubelet(work / f"{node}.sock", pods).start()
            cleanup.callback(kubelet.close)
            exporters[node] = Exporter(
                *("-c", COLLECT_MS, "-k"),
                *("--pod-resources-kubelet-socket", str(kubelet.socket_path)),
                fleet=fleet,
                env={"NODE_NAME": node},
            )
            cleanup.callback(exporters[node].stop)

        for name in ("gpu-recording.rules.yaml", "gpu-alerts.rules.yaml"):
            text = scaled_rules((ALERTS / name).read_text(encoding="utf-8"))
            (work / name).write_text(text, encoding="utf-8")
        config = {
            "global": {
                "scrape_interval": SCRAPE,
                "scrape_timeout": SCRAPE,
                "evaluation_interval": "1s",
            },
            "rule_files": [
                str(work / "gpu-recording.rules.yaml"),
                str(work / "gpu-alerts.rules.yaml"),
            ],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [alertmanager.address]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": "gpu-exporter",
                    # What the shipped ServiceMonitor adds (node), and a cluster label, which
                    # the routes group by and the inhibitions match on.
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{exporter.port}"],
                            "labels": {"node": node, "cluster": CLUSTER},
                        }
                        for node, exporter in exporters.items()
                    ],
                }
            ],
        }
        (work / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
        # Prometheus starts while the exporters come up: it applies its targets only
        # about 5 s after starting, so waiting for the exporters first would waste that.
        prometheus = Prometheus(work / "prometheus.yml", work)
        cleanup.callback(prometheus.stop)
        for exporter in exporters.values():
            exporter.wait_ready()

        # increase() sees a counter rise only from a sample taken before: the faulted
        # counters must have been scraped at 0 before the faults come.
        fault_at = _fault_time(NODES[FAULTY])
        before = f'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{node="{FAULTY}", gpu=~"1|7"}} == 0'
        wait_until(
            lambda: len(prometheus.query(before)) == 2,
            max(started + fault_at - 1 - time.monotonic(), 0.1),
            f"a scrape of the faulty node before its faults at {fault_at} s (machine too slow?)",
        )
        print(f"first scrape at {time.monotonic() - started:.1f} s")
        yield Stack(prometheus, alertmanager, webhook, uuids, started)


# ---- what arrived ------------------------------------------------------------------------


def _matches(labels: dict[str, str], want: dict[str, Any]) -> bool:
    return all((k not in labels) if v is None else labels.get(k) == str(v) for k, v in want.items())


def _groups(
    notifications: list[tuple[str, dict[str, Any]]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[dict[str, Any]]]:
    """(receiver, group labels) -> the alerts of that group's latest notification."""
    out = {}
    for _path, payload in notifications:
        key = (payload["receiver"], tuple(sorted(payload["groupLabels"].items())))
        out[key] = payload["alerts"]
    return out


def _expected_key(group: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return group["receiver"], tuple(sorted(group["group"].items()))


def _complete(notifications: list[tuple[str, dict[str, Any]]]) -> bool:
    groups = _groups(notifications)
    for group in EXPECTED["delivered"]:
        alerts = groups.get(_expected_key(group), [])
        for want in group["alerts"]:
            if not any(_matches(a["labels"], want) for a in alerts):
                return False
    return True


def _summary(notifications: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = set()
    for _path, payload in notifications:
        for alert in payload["alerts"]:
            labels = alert["labels"]
            keys = ("alertname", "severity", "node", "gpu", "GPU_I_ID", "xid", "namespace")
            what = " ".join(f"{k}={labels[k]}" for k in keys if k in labels)
            lines.add(f"{payload['receiver']}: {what} ({alert['status']})")
    return sorted(lines)


@pytest.fixture(scope="module")
def delivered(stack: Stack) -> list[tuple[str, dict[str, Any]]]:
    """Every notification, once the expected ones arrived and QUIET_S passed without more."""
    deadline = stack.started + DELIVERY_DEADLINE_S
    while not _complete(stack.webhook.received()):
        if time.monotonic() > deadline:
            got = "\n".join(_summary(stack.webhook.received()))
            pytest.fail(
                f"not everything expected arrived within {DELIVERY_DEADLINE_S} s; got:\n{got}"
            )
        time.sleep(0.2)
    print(f"expected notifications complete at {time.monotonic() - stack.started:.1f} s")
    count = len(stack.webhook.received())
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:
        if len(stack.webhook.received()) != count:
            count = len(stack.webhook.received())
            quiet_until = time.monotonic() + QUIET_S
        time.sleep(0.2)
    return stack.webhook.received()


def test_faulty_node_alerts_arrive_routed_and_grouped(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    summary = "\n".join(_summary(delivered))
    for path, payload in delivered:
        assert path == payload["receiver"], "the receiver's own URL"
        assert payload["status"] == "firing", summary
        group_labels = payload["groupLabels"]
        for alert in payload["alerts"]:
            labels = alert["labels"]
            assert alert["status"] == "firing", summary
            assert labels["node"] == FAULTY, f"an alert from another node:\n{summary}"
            assert labels["cluster"] == CLUSTER, f"{labels['alertname']} lost the cluster label"
            assert labels["job"] == "gpu-exporter"
            assert {k: labels.get(k) for k in group_labels} == group_labels
            if "gpu" in labels:
                assert labels["UUID"] == stack.uuids[FAULTY][labels["gpu"]]
                assert labels["UUID"] in alert["annotations"]["description"]
                assert f"GPU {labels['gpu']} " in alert["annotations"]["description"]
            assert alert["annotations"]["summary"].endswith(".")
            assert alert["annotations"]["runbook_url"].endswith(f"/{labels['alertname']}.md")

    groups = _groups(delivered)
    expected = {_expected_key(group): group["alerts"] for group in EXPECTED["delivered"]}
    assert sorted(groups) == sorted(expected), summary
    for key, wanted in expected.items():
        alerts = groups[key]
        # the latest notification of a group holds all its alerts, each exactly once
        assert len(alerts) == len(wanted), f"{key}:\n{summary}"
        for want in wanted:
            assert [_matches(a["labels"], want) for a in alerts].count(True) == 1, (key, want)


def test_critical_alerts_inhibit_the_warnings_on_their_gpu(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    alerts = stack.alertmanager.alerts()
    by_fingerprint = {a["fingerprint"]: a for a in alerts}
    for want in EXPECTED["inhibited"]:
        found = [a for a in alerts if _matches(a["labels"], {**want, "node": FAULTY})]
        assert len(found) == 1, f"{want} did not reach Alertmanager"
        status = found[0]["status"]
        assert status["state"] == "suppressed" and status["inhibitedBy"], (want, status)
        for fingerprint in status["inhibitedBy"]:
            source = by_fingerprint[fingerprint]["labels"]
            assert source["severity"] == "critical"
            assert source["UUID"] == found[0]["labels"]["UUID"]
        assert not any(
            _matches(a["labels"], {**want, "node": FAULTY})
            for _path, payload in delivered
            for a in payload["alerts"]
        ), f"{want} was delivered"


def test_healthy_node_raises_nothing(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    for _path, payload in delivered:
        for alert in payload["alerts"]:
            assert alert["labels"].get("node") == FAULTY, alert["labels"]
    # not even pending: nothing on the healthy node came close
    pending = [
        a["labels"]
        for a in stack.get("/api/v1/alerts")["alerts"]
        if a["labels"].get("node") != FAULTY
    ]
    assert pending == []
    # for as long as the faulty node: same scrapes, same rule evaluations
    counts = {
        r["metric"]["node"]: float(r["value"][1])
        for r in stack.prometheus.query('count_over_time(up{job="gpu-exporter"}[10m])')
    }
    assert counts[HEALTHY] >= counts[FAULTY] - 2, counts
    assert counts[HEALTHY] >= 20, counts  # 10 s at least, past the faults and QUIET_S


def test_every_rule_evaluates_cleanly_on_the_exporter_output(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    groups = stack.get("/api/v1/rules")["groups"]
    broken = {
        rule["name"]: rule.get("lastError")
        for group in groups
        for rule in group["rules"]
        if rule["health"] != "ok"
    }
    assert broken == {}


# ---- dashboards --------------------------------------------------------------------------

# Grafana's variables for a user looking at the faulty node, all its GPUs and pods.
# $__rate_interval and $__range cover the whole run (DELIVERY_DEADLINE_S and then some),
# so counters that moved show it.
GRAFANA = {
    "$__rate_interval": "2m",
    "$__range_s": "120",
    "$__range": "2m",
}
SELECTED = {"cluster": CLUSTER, "node": FAULTY, "gpu": ".*", "namespace": ".*", "pod": ".*"}
# Queries that may legitimately return nothing on this node: (dashboard, panel title,
# refId) -> why. They must still be valid PromQL.
NO_DATA: dict[tuple[str, str, str], str] = {
    ("gpu-health.json", panel, ref): "the fabric rows are off in the shipped metrics file; "
    "tests/e2e/test_fabric_alert.py answers them on the GB200 tray with the rows on"
    for panel, refs in (
        ("Fabric registration", "A"),
        ("Fabric health", "A"),
        ("Fabric by GPU", "ABCDEF"),
    )
    for ref in refs
} | {
    ("gpu-health.json", "NVLink errors", ref): "Blackwell's NVLink5 counters; the node is H100"
    for ref in "EF"
}
# Dashboards whose rules this stack does not load (the alerts it checks fire on faults
# only): tests/dashboards/test_dcgm_queries_e2e.py shows their queries with data.
OTHER_RULES = {"gpu-accounting.json": "alerts/gpu-accounting.rules.yaml"}


def _dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard, panel title, refId, expression) of every panel target."""
    out = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        panels = []
        for panel in dashboard["panels"]:
            panels.append(panel)
            panels.extend(panel.get("panels", []))
        for panel in panels:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["refId"], target["expr"]))
    return out


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr


def _variable_values(stack: Stack) -> dict[str, dict[str, list[str]]]:
    """dashboard -> variable -> the values its label_values() query offers."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] != "query":
                continue
            query = _substitute(variable["query"], SELECTED)
            selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", query).groups()
            values = stack.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
            out.setdefault(path.name, {})[variable["name"]] = values
    return out


def test_dashboard_variables_offer_the_nodes_and_their_gpus(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    values = _variable_values(stack)
    for name in ("gpu-fleet.json", "gpu-health.json"):
        assert values[name] == {
            "cluster": [CLUSTER],
            "node": sorted(NODES),
            "gpu": sorted(stack.uuids[FAULTY]),
        }
    workloads = values["gpu-workloads.json"]
    assert workloads["cluster"] == [CLUSTER]
    assert workloads["node"] == sorted(NODES)
    assert workloads["namespace"] == ["batch", "inference", "ml-training", "research"]
    assert "notebook-0" in workloads["pod"] and "server-0" in workloads["pod"]


def test_every_dashboard_query_returns_data(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    empty = {}
    for dashboard, title, ref, expr in _dashboard_queries():
        if dashboard in OTHER_RULES:
            continue
        result = stack.get("/api/v1/query", query=_substitute(expr, SELECTED))["result"]
        if not result and (dashboard, title, ref) not in NO_DATA:
            empty[(dashboard, title, ref)] = expr
    assert empty == {}


def test_health_dashboard_shows_the_faults(
    stack: Stack, delivered: list[tuple[str, dict[str, Any]]]
) -> None:
    queries = {(d, t, r): e for d, t, r, e in _dashboard_queries() if d == "gpu-health.json"}

    def panel(title: str, ref: str = "A") -> list[dict[str, Any]]:
        expr = _substitute(queries[("gpu-health.json", title, ref)], SELECTED)
        return stack.get("/api/v1/query", query=expr)["result"]

    def by_gpu(result: list[dict[str, Any]]) -> dict[str, float]:
        return {r["metric"].get("gpu", ""): float(r["value"][1]) for r in result}

    assert [float(r["value"][1]) for r in panel("GPUs not responding")] == [1]
    assert by_gpu(panel("GPUs per node")) == {"": 7}
    xids = {(r["metric"]["gpu"], r["metric"]["xid"]) for r in panel("XIDs in the time range")}
    assert xids == {("0", "79"), ("2", "94"), ("4", "74"), ("5", "31"), ("6", "13")}
    dbe = by_gpu(panel("ECC errors", "B"))
    assert dbe["1"] > 0 and dbe["7"] > 0 and dbe["2"] == 0
    thermal = by_gpu(panel("Throttling", "A"))
    assert thermal["2"] > 0 and thermal["3"] > 0 and thermal["1"] == 0
    firing = {
        (r["metric"]["alertname"], r["metric"].get("gpu")) for r in panel("Firing alerts by GPU")
    }
    assert ("GPUXidHardwareCritical", "0") in firing and ("GPUTemperatureHigh", "2") in firing
