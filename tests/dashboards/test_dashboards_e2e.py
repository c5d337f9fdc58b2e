"""End to end: a real Prometheus scrapes a simulated GPU node and evaluates the rules;
every dashboard query and variable must then return data, and every rule be healthy.

The node is fixtures/gpu-node.prom served over HTTP, with counters growing on each scrape
and the exporter's last-success timestamp kept current.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu-node.prom"
SCRAPE = "250ms"
# Grafana variables as a dashboard user who selects "All" would send them.
SUBSTITUTIONS = [
    ("$__rate_interval", "1s"),  # Grafana: four scrape intervals
    ("$__range_s", "60"),
    ("$__range", "1m"),
    ("$cluster", ".*"),
    ("$node", ".*"),
    ("$gpu", ".*"),
    ("$namespace", ".*"),
    ("$pod", ".*"),
]


class _Node:
    """Renders the fixture exposition; counters advance by one per scrape."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.counters = set(re.findall(r"^# TYPE (\S+) counter$", text, re.M))
        self.scrapes = 0
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            step = self.scrapes
        out = []
        for line in self.lines:
            name = re.match(r"[^{ #]+", line)
            if name and name.group() in self.counters:
                series, value = line.rsplit(" ", 1)
                line = f"{series} {float(value) + step}"
            elif name and name.group() == "gpu_exporter_last_collection_success_timestamp_seconds":
                line = f"{name.group()} {time.time()}"
            out.append(line)
        return ("\n".join(out) + "\n").encode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("prometheus not found on PATH: install the Debian package `prometheus`")
    node = _Node(FIXTURE.read_text(encoding="utf-8"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = node.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": [
            str(REPO / "alerts/gpu-recording.rules.yaml"),
            str(REPO / "alerts/gpu-alerts.rules.yaml"),
            str(REPO / "alerts/gpu-accounting.rules.yaml"),
        ],
        "scrape_configs": [
            {
                "job_name": "gpu-exporter",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{server.server_address[1]}"],
                        # What the shipped ServiceMonitor and a multi-cluster setup add.
                        "labels": {"node": "gpu-node-1", "cluster": "lab"},
                    }
                ],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
    port = _free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail((tmp / "prometheus.log").read_text())
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        server.shutdown()


def _substitute(expr: str) -> str:
    for variable, value in SUBSTITUTIONS:
        expr = expr.replace(variable, value)
    return expr


def _queries() -> list[tuple[str, str]]:
    """(where, expression) of every panel target and variable of every dashboard."""
    queries = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in dashboard["panels"]:
            for query in panel.get("targets", []):
                queries.append((f"{path.name}: {panel['title']}", query["expr"]))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                queries.append((f"{path.name}: ${variable['name']}", variable["query"]))
    return queries


def _has_data(url: str, expr: str) -> str | None:
    """None when the query returns data, else why not."""
    expr = _substitute(expr)
    label_values = re.fullmatch(r"label_values\((.+), (\w+)\)", expr)
    if label_values:
        selector, label = label_values.groups()
        params = urllib.parse.urlencode({"match[]": selector})
        answer = _get(f"{url}/api/v1/label/{label}/values?{params}")
    else:
        answer = _get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        answer["data"] = answer["data"]["result"]
    if answer["status"] != "success":
        return f"{answer['status']}: {answer.get('error')}"
    return None if answer["data"] else "no data"


# Blackwell's NVLink5 counters: the fixture's GPUs are H100s, which do not serve them
# (tests/dashboards/test_dashboards.py finds them served on the simulated GB200 tray)
BLACKWELL_ONLY = ("DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
                  "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS")  # fmt: skip


def test_every_dashboard_query_returns_data(prometheus: str) -> None:
    queries = _queries()
    for where, expr in queries:
        if any(name in expr for name in BLACKWELL_ONLY):
            assert _has_data(prometheus, expr) in (None, "no data"), where  # valid PromQL
    pending = dict.fromkeys(
        [q for q in queries if not any(name in q[1] for name in BLACKWELL_ONLY)], "not run"
    )
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for key in list(pending):
            problem = _has_data(prometheus, key[1])
            if problem is None:
                del pending[key]
            else:
                pending[key] = problem
        if pending:
            time.sleep(1)
    assert pending == {}


def test_every_rule_evaluates_without_error(prometheus: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        groups = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if rules and all(rule["health"] != "unknown" for rule in rules):
            break
        assert time.monotonic() < deadline, "rules were not evaluated"
        time.sleep(0.5)
    broken = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert broken == {}
