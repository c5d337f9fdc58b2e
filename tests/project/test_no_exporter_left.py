"""tests/conftest.py fails a test that leaves an exporter running, and kills it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.procs import ROOT

INNER = """
import subprocess, sys, time
from tests.procs import Exporter, ROOT, free_port

def test_forgets_to_stop():
    exp = Exporter("-c", "300")
    exp.wait_ready()
    open({pids!r}, "a").write(f"{{exp.proc.pid}}\\n")

def test_starts_one_by_hand():
    argv = [sys.executable, "-m", "exporter", "--simulate", "-a", f"127.0.0.1:{{free_port()}}"]
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    assert p.poll() is None
    open({pids!r}, "a").write(f"{{p.pid}}\\n")

def test_stops_its_exporter():
    exp = Exporter("-c", "300")
    exp.wait_ready()
    exp.stop()
"""


def test_a_test_that_leaves_an_exporter_running_fails_and_it_is_killed(tmp_path):
    pids = tmp_path / "pids"
    (tmp_path / "test_inner.py").write_text(INNER.format(pids=str(pids)))
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "3 passed, 2 errors" in out, out
    # one report per leaked process; the short summary repeats it only where the
    # terminal is wide enough, so count the teardown reports' own lines
    said = "exporter process(es) left running, now killed"
    reports = [ln for ln in out.splitlines() if ln.startswith(said)]
    assert len(reports) == 2, out
    left = [pid for pid in map(int, pids.read_text().split()) if os.path.exists(f"/proc/{pid}")]
    for pid in left:  # the guard failed: do its work, so that nothing outlives this test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"exporters {left} were still running"
