"""python -m exporter.sim.run runs a pynvml program against the simulation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.sim.conftest import MIXED

ROOT = Path(__file__).parents[2]
SCRIPT = """
import sys
import pynvml
pynvml.nvmlInit()
names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
         for i in range(pynvml.nvmlDeviceGetCount())]
print(sys.argv[1:], names)
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exporter.sim.run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runs_a_script_file(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    p = run("--fleet", str(MIXED), "--no-latency", "--", str(script), "a", "b")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        "['a', 'b'] ['NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-40GB', 'NVIDIA L4', 'Tesla T4']"
    )


def test_runs_a_module(tmp_path):
    (tmp_path / "probe_mod.py").write_text(SCRIPT)
    p = subprocess.run(
        [sys.executable, "-m", "exporter.sim.run", "--", "-m", "probe_mod", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("['x'] ['NVIDIA H100 80GB HBM3'")


def test_bad_fleet_and_unknown_target(tmp_path):
    p = run("--fleet", str(tmp_path / "nope.yaml"), "--", "x.py")
    assert p.returncode == 2 and "nope.yaml: cannot read the fleet file" in p.stderr
    p = run("--", "no-such-console-script")
    assert p.returncode == 2 and "is not a module" in p.stderr
