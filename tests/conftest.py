"""Marks the slow tests, so that ``python3 -m pytest -m "not slow"`` is a quick check.

Slow means: starts the exporter, Prometheus or Alertmanager as a process, builds
the image, renders the manifests (kubectl kustomize), soaks, fuzzes, or attacks and
faults a running exporter. The full suite, ``python3 -m pytest -q``, still runs every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

# Test ids (relative to the repository root) starting with one of these are slow;
# so is every test in a file named *_e2e.py.
SLOW = (
    "tests/e2e/",  # the exporter as a subprocess, scraped by a real Prometheus
    "tests/reliability/",  # attacks, faults, hangs, signals and the soak
    "tests/fuzz/",  # hypothesis searches
    "tests/benchmarks/",  # runs the benchmark suite's quick mode
    "tests/deploy/",  # kubectl kustomize on every overlay, the image build, a real Prometheus
    "tests/alerts/test_alert_rules.py::test_promtool_unit_tests_pass",
    "tests/alerts/test_alertmanager_config.py::test_inhibitions_in_a_real_alertmanager",
    "tests/alerts/test_alertmanager_config.py::test_every_alert_rule_reaches_its_receiver",
    "tests/kube/test_hostile_api.py",  # 100,000-pod lists and watches
    "tests/unit/test_cli_inputs.py",  # every bad input through the command line, a process each
    "tests/unit/test_cli_startup.py",  # the exporter started with dcgm-exporter's CSVs
    "tests/web/test_tls.py",  # exporters over TLS, certificate rotation, a real Prometheus
)


@pytest.fixture(autouse=True)
def _short_event_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process collectors wait 50 ms per nvmlEventSetWait_v2 call instead of 500 ms.

    Closing a collector joins its XID event thread, which returns within one wait:
    this keeps each close under 0.1 s. Exporters started as processes are unchanged.
    """
    from exporter.nvml import events

    monkeypatch.setattr(events, "WAIT_MS", 50)


def _slow(nodeid: str) -> bool:
    return nodeid.startswith(SLOW) or nodeid.split("::")[0].endswith("_e2e.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "not slow"``, files that hold only slow tests are not even imported."""
    if " ".join(config.option.markexpr.split()) != "not slow":
        return None
    try:
        rel = collection_path.relative_to(ROOT).as_posix()
    except ValueError:
        return None
    whole = [s for s in SLOW if "::" not in s]
    if any(rel == s.rstrip("/") or rel.startswith(s) for s in whole) or rel.endswith("_e2e.py"):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
