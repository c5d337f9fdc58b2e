"""End to end: the GB200 tray's GPU whose fabric registration never finished raises
GPUFabricUnhealthy in a real Prometheus, and the health dashboard's fabric panels answer.

The exporter runs on exporter/sim/fleets/gb200.yaml (GPUs 0-2 registered and healthy,
GPU 3 stuck "in progress") with the shipped metrics file, whose fabric rows are on. A real
Prometheus scrapes it with alerts/gpu-alerts.rules.yaml, its ``for:`` shortened as in
tests/e2e/test_alerting.py.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

import pytest

from exporter.sim import FLEETS_DIR
from tests.e2e.test_alerting import scaled_rules
from tests.procs import ROOT, Exporter, Prometheus, require, wait_until

FLEET = FLEETS_DIR / "gb200.yaml"
SCRAPE = "500ms"


def test_the_shipped_metrics_file_has_the_fabric_rows() -> None:
    text = (ROOT / "metrics.csv").read_text(encoding="utf-8")
    assert len(re.findall(r"^DCGM_FI_DEV_FABRIC_\w+,", text, re.M)) == 4


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, Prometheus]]:
    require("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("fabric")
    with contextlib.ExitStack() as cleanup:
        exporter = Exporter("-c", "500", fleet=FLEET, env={"NODE_NAME": "tray"})
        cleanup.callback(exporter.stop)
        rules = work / "gpu-alerts.rules.yaml"
        rules.write_text(scaled_rules((ROOT / "alerts" / rules.name).read_text()), "utf-8")
        config = {
            "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "gpu-exporter",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{exporter.port}"],
                            "labels": {"node": "tray", "cluster": "lab"},
                        }
                    ],
                }
            ],
        }
        (work / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
        prom = Prometheus(work / "prometheus.yml", work)
        cleanup.callback(prom.stop)
        exporter.wait_ready()
        yield exporter, prom


def test_the_stuck_gpu_and_only_it_raises_the_fabric_alert(node):
    exporter, prom = node
    status = exporter.metrics()
    assert 'DCGM_FI_DEV_FABRIC_MANAGER_STATUS{gpu="3",' in status
    firing = 'ALERTS{alertname="GPUFabricUnhealthy", alertstate="firing"}'
    got = wait_until(lambda: prom.query(firing), 60, "GPUFabricUnhealthy to fire")
    assert [(a["metric"]["gpu"], a["metric"]["problem"]) for a in got] == [("3", "in_progress")]
    assert got[0]["metric"]["severity"] == "critical"


def test_the_health_dashboards_fabric_panels_answer(node):
    _, prom = node
    board = json.loads((ROOT / "dashboards" / "gpu-health.json").read_text(encoding="utf-8"))
    panels = [p for p in board["panels"] if p["title"].startswith("Fabric")]
    assert len(panels) == 3
    values = {"$cluster": ".*", "$node": ".*", "$gpu": ".*"}
    for panel in panels:
        for query in panel["targets"]:
            expr = query["expr"]
            for name, value in values.items():
                expr = expr.replace(name, value)
            answer = wait_until(lambda e=expr: prom.query(e), 30, f"{panel['title']}: {expr}")
            assert {a["metric"]["gpu"] for a in answer} == {"0", "1", "2", "3"}, panel["title"]
