"""alerts/alertmanager.yaml: valid, routes each case as stated, inhibits as stated.

Routing is checked with `amtool config routes test`; inhibition with a real Alertmanager
started on a free local port, fed the alerts of alerts/tests/inhibitions.yaml through its
API and asked which of them it holds as inhibited.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "alerts" / "alertmanager.yaml"
ROUTE_CASES = yaml.safe_load((REPO / "alerts/tests/routes.yaml").read_text(encoding="utf-8"))[
    "cases"
]
INHIBITION_CASES = yaml.safe_load(
    (REPO / "alerts/tests/inhibitions.yaml").read_text(encoding="utf-8")
)["alerts"]


def _routes(amtool: str, labels: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            *(f"{key}={value}" for key, value in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().split(",")


def _expected_receiver(labels: dict[str, str]) -> str:
    """The routing policy of the issue, restated independently of the config."""
    if labels["severity"] == "info":
        return "gpu-low-urgency"
    if labels["category"] == "application":
        return "team-ml-training"  # the namespace given below
    if labels["severity"] == "critical":
        return "gpu-infra-pager"
    return "gpu-infra"


def test_amtool_check_config(amtool: str) -> None:
    result = subprocess.run(
        [amtool, "check-config", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[case["name"] for case in ROUTE_CASES])
def test_route(amtool: str, case: dict[str, Any]) -> None:
    assert _routes(amtool, case["labels"]) == case["receivers"]


def test_every_receiver_has_a_route_case() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    receivers = {receiver["name"] for receiver in config["receivers"]}
    covered = {name for case in ROUTE_CASES for name in case["receivers"]}
    assert covered == receivers


def test_every_alert_rule_reaches_its_receiver(
    amtool: str, alert_rules: list[dict[str, Any]]
) -> None:
    for rule in alert_rules:
        labels = {
            "alertname": rule["alert"],
            **rule["labels"],
            "node": "gpu-node-1",
            "namespace": "ml-training",
        }
        assert _routes(amtool, labels) == [_expected_receiver(labels)], rule["alert"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


@pytest.fixture
def alertmanager(alertmanager_bin: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "alertmanager.log").open("w")
    proc = subprocess.Popen(
        [
            alertmanager_bin,
            f"--config.file={CONFIG}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"Alertmanager did not start:\n{tmp_path / 'alertmanager.log'}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _inhibited(url: str) -> dict[str, bool]:
    alerts = _request(f"{url}/api/v2/alerts?active=true&inhibited=true&silenced=true")
    return {alert["labels"]["case"]: bool(alert["status"]["inhibitedBy"]) for alert in alerts}


def test_inhibitions_in_a_real_alertmanager(alertmanager: str) -> None:
    now = datetime.now(UTC)
    _request(
        f"{alertmanager}/api/v2/alerts",
        [
            {
                # `case` only names the alert for the test; no rule matches on it.
                "labels": {**case["labels"], "case": case["id"]},
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for case in INHIBITION_CASES
        ],
    )
    expected = {case["id"]: case["inhibited"] for case in INHIBITION_CASES}
    # The inhibitor learns about source alerts asynchronously: wait until the answer
    # matches, then check again that it stays that way.
    deadline = time.monotonic() + 10
    seen = _inhibited(alertmanager)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = _inhibited(alertmanager)
    assert seen == expected
    time.sleep(1)
    assert _inhibited(alertmanager) == expected
