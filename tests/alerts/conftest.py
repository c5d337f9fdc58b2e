"""Fixtures for the alert, recording-rule and Alertmanager tests: paths and tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
RULE_FILES = ("gpu-recording.rules.yaml", "gpu-alerts.rules.yaml", "gpu-accounting.rules.yaml")


def _tool(names: tuple[str, ...], package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"{names[0]} not found on PATH: install the Debian package `{package}`")


@pytest.fixture(scope="session")
def alerts_dir() -> Path:
    return ALERTS


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool(("promtool",), "prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return _tool(("amtool",), "prometheus-alertmanager")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    return _tool(("prometheus-alertmanager", "alertmanager"), "prometheus-alertmanager")


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for name in RULE_FILES
        for group in _load(ALERTS / name)["groups"]
        for rule in group["rules"]
    ]


@pytest.fixture(scope="session")
def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of the generated rule files."""
    return [rule for rule in _rules() if "alert" in rule]


@pytest.fixture(scope="session")
def recording_rules() -> list[dict[str, Any]]:
    """Every recording rule of the generated rule files."""
    return [rule for rule in _rules() if "record" in rule]


@pytest.fixture(scope="session")
def unit_test_files() -> list[Path]:
    return sorted((ALERTS / "tests").glob("*.test.yaml"))


def promtool_failures(promtool: str, files: list[Path]) -> dict[str, str]:
    """`promtool test rules` on each file, all at once (they are independent): the output
    of each file that failed, by file name."""
    runs = {
        path.name: subprocess.Popen(
            [promtool, "test", "rules", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for path in files
    }
    failed = {}
    for name, proc in runs.items():
        output, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            failed[name] = output
    return failed
