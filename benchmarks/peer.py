"""nvitop-exporter, the peer: its own virtual environment, its process, its cycle.

The venv (benchmarks/.venv-peer, ignored by git) is created on first use with
``pip install nvitop-exporter==PEER_VERSION pyyaml``; nothing of it is
installed into the project's environment. It runs against the same simulated
driver through ``python -m exporter.sim.run``, with the repository on
PYTHONPATH so the simulator (and benchmarks.peer_cycle) can be imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.procs import ROOT, Process, free_port

PEER_VERSION = "1.7.2"
VENV = ROOT / "benchmarks" / ".venv-peer"


class PeerUnavailable(RuntimeError):
    """The peer's venv could not be made (no registry, no venv module)."""


def python() -> Path:
    return VENV / "bin" / "python"


def installed_version() -> str | None:
    """nvitop-exporter's version in the venv, or None when the venv is not usable."""
    if not python().exists():
        return None
    p = subprocess.run(
        [
            str(python()),
            "-c",
            "import importlib.metadata as m; print(m.version('nvitop-exporter'))",
        ],
        capture_output=True,
        text=True,
    )
    return p.stdout.strip() if p.returncode == 0 else None


def ensure(log: Path) -> str:
    """Make the venv if it is missing or has another version; returns the version."""
    version = installed_version()
    if version == PEER_VERSION:
        return version
    with log.open("w") as out:
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(VENV)],
            [
                str(python()),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"nvitop-exporter=={PEER_VERSION}",
                "pyyaml",
            ],
        ]
        for argv in steps:
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise PeerUnavailable(f"{' '.join(argv[:4])} failed; see {log}")
    version = installed_version()
    if version is None:
        raise PeerUnavailable(f"nvitop-exporter not importable after install; see {log}")
    return version


def env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT)}


def start(fleet: Path, interval_s: float, log: Path | None = None) -> Process:
    """nvitop-exporter on the simulated driver, as the simulator's docs run it."""
    port = free_port()
    argv = [str(python()), "-m", "exporter.sim.run", "--fleet", str(fleet), "--"]
    argv += ["nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port)]
    argv += ["--interval", f"{interval_s:g}", "--hostname", "bench-node"]
    return Process(argv, port, env=env(), log=log)


def cycle(fleet: Path, cycles: int, warmup: int) -> dict[str, Any]:
    """benchmarks.peer_cycle in the peer's venv; its JSON result."""
    argv = [str(python()), "-m", "benchmarks.peer_cycle", str(fleet)]
    argv += ["--cycles", str(cycles), "--warmup", str(warmup)]
    p = subprocess.run(argv, cwd=ROOT, env=_full_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"peer cycle failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _full_env() -> dict[str, str]:
    import os

    return {**os.environ, **env()}
