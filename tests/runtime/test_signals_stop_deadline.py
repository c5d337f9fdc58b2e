"""A stop that hangs past its deadline still ends the process, with status 0."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.procs import ROOT

HANGS = """
import threading, time
from exporter.runtime import signals
signals.exit_after(0.3)
threading.Event().wait(30)  # a close that never returns
"""


def test_a_hung_stop_ends_at_the_deadline():
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", HANGS], cwd=ROOT, capture_output=True, text=True, timeout=20
    )
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert "stop did not finish in 0.3 s; exiting now" in p.stderr
    assert took < 15  # far from the 30 s the close would have taken


BLOCKED_WORKER = """
import asyncio, os, signal, socket, sys, threading

class Loops(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self):
        loop = super().new_event_loop()
        # once serving: a call in the loop's executor that never returns, then SIGTERM
        loop.call_later(1.0, lambda: loop.run_in_executor(None, threading.Event().wait))
        loop.call_later(1.2, os.kill, os.getpid(), signal.SIGTERM)
        return loop

asyncio.set_event_loop_policy(Loops())
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
from exporter.cli import main
sys.exit(main(["--simulate", "-a", f"127.0.0.1:{port}"]))
"""


def test_a_blocked_executor_thread_does_not_hold_the_stop():
    """A call still running in the event loop's executor (a read, a request, an import)
    is not waited for when the loop ends: the stop finishes by itself, before the
    deadline, and the process exits 0."""
    p = subprocess.run(
        [sys.executable, "-c", BLOCKED_WORKER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "stopping" in p.stderr
    assert "stop did not finish" not in p.stderr, p.stderr[-2000:]
