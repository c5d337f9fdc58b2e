"""The process harness of the tests: benchmarks/procs.py, plus a skip for a missing tool.

Exporter (the exporter on the simulated driver, its output in a file), Prometheus
(a real server) and the helpers come from benchmarks.procs, the one harness the
tests and the benchmarks share.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import procs
from benchmarks.procs import (
    ROOT,
    STARTED,
    Exporter,
    Process,
    free_port,
    http_get,
    wait_until,
)

__all__ = [
    "ROOT",
    "STARTED",
    "Exporter",
    "Process",
    "Prometheus",
    "free_port",
    "http_get",
    "require",
    "wait_until",
]


def require(tool: str, package: str) -> str:
    """The path of ``tool``, or skip the test naming the Debian package to install."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not installed: apt-get install {package} (.ci/run does)")
    return path


class Prometheus(procs.Prometheus):
    """A real Prometheus server on a free port (skips when Prometheus is not installed)."""

    def __init__(self, config: Path, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        super().__init__(config, workdir, extra, binary=require("prometheus", "prometheus"))
