"""Marks the slow tests, so that ``python3 -m pytest -m "not slow"`` is a quick check.

Slow means: starts the exporter or a real server (Prometheus, Alertmanager) as a
subprocess, builds an image, soaks, or attacks and faults a running process. The
full suite, ``python3 -m pytest -q``, still runs every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# Whole directories of subprocess end-to-end tests.
SLOW_DIRS = {"e2e", "reliability"}
# Single files (relative to tests/) that start processes or real servers; any file
# named *_e2e.py is slow too.
SLOW_FILES = {
    "deploy/test_image.py",  # builds the container image (buildah) and runs it
    "deploy/test_annotation_scrape.py",  # real Prometheus scraping the exporter
    "unit/test_cli_startup.py",  # the exporter started with dcgm-exporter's CSVs
}


def _slow(path: Path) -> bool:
    rel = path.relative_to(TESTS)
    return rel.parts[0] in SLOW_DIRS or rel.as_posix() in SLOW_FILES or rel.stem.endswith("_e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _slow(Path(item.path)):
            item.add_marker(pytest.mark.slow)
