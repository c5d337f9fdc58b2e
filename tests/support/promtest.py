"""One promtool unit test of a shipped alert, fed with what the exporter served: the rule
read from alerts/gpu-alerts.rules.yaml, the series as a scrape stores them (job and
instance added), quiet before the rule's `for:` and firing with the expected labels and
annotations after it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

RULES = "gpu-alerts.rules.yaml"
TARGET = {"job": "gpu-exporter", "instance": "10.0.0.1:9400"}  # what the scrape adds


def shipped_rule(alerts_dir: Path, alert: str) -> dict:
    """The one rule named ``alert`` in the shipped alerts file."""
    groups = yaml.safe_load((alerts_dir / RULES).read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == alert]
    return rule


def assert_fires(
    promtool: str,
    tmp_path: Path,
    alerts_dir: Path,
    alert: str,
    series: tuple[str, dict[str, str], str],
    times: tuple[str, str],
    labels: dict[str, str],
    description: str,
) -> None:
    """promtool passes: the series ``(family, labels as scraped, promtool values)`` leaves
    ``alert`` quiet at ``times[0]`` and firing at ``times[1]`` with the rule's labels plus
    ``labels``, its summary and runbook, and ``description``."""
    rule = shipped_rule(alerts_dir, alert)
    family, scraped, values = series
    selector = ", ".join(f'{k}="{v}"' for k, v in scraped.items())
    annotations = {
        "summary": rule["annotations"]["summary"],
        "description": description,
        "runbook_url": rule["annotations"]["runbook_url"],
    }
    fired = {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}
    test = {
        "rule_files": [str(alerts_dir / RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"{family}{{{selector}}}", "values": values}],
                "alert_rule_test": [
                    {"eval_time": times[0], "alertname": alert, "exp_alerts": []},
                    {"eval_time": times[1], "alertname": alert, "exp_alerts": [fired]},
                ],
            }
        ],
    }
    path = tmp_path / f"{alert}.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    p = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
