"""docs/quickstart.md, run as written: the simulated node with ``--simulate -k`` (the
simulator's own kubelet), a real Prometheus with the shipped recording rules, and the
per-namespace GPU-hours it answers (on free ports instead of 9400 and 9090, in a temporary
folder instead of /tmp/gpu-quickstart)."""

from __future__ import annotations

import re
import subprocess

from tests.procs import ROOT, free_port, require

DOC = (ROOT / "docs" / "quickstart.md").read_text()
BLOCKS = re.findall(r"```sh\n(.*?)```", DOC, re.S)
INSTALL = "python3 -m pip install -e '.[kube]'\n"


def test_the_first_block_is_the_install_and_the_readme_runs_the_same_command():
    assert BLOCKS[0] == INSTALL
    assert "gpu-exporter --simulate -k" in (ROOT / "README.md").read_text()


def test_quickstart_answers_gpu_hours_per_namespace(tmp_path):
    require("prometheus", "prometheus")
    # the install is the environment's (pip install -e '.[test]' has the kube extra)
    script = "".join(BLOCKS[1:])
    script = script.replace(":9400", f":{free_port()}").replace(":9090", f":{free_port()}")
    script = script.replace("/tmp/gpu-quickstart", str(tmp_path / "q"))
    wrapped = f"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{script}"
    p = subprocess.run(
        ["timeout", "240", "bash", "-c", wrapped],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [line.split() for line in p.stdout.splitlines() if line.endswith("GPU-hours")]
    namespaces = {fields[0] for fields in lines}
    assert namespaces == {"batch", "media", "ml", "research", "serving"}, p.stdout
    assert all(float(fields[1]) > 0 for fields in lines)
