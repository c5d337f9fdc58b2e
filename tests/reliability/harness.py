"""The exporter as a subprocess, as tests/procs.py starts it, with its log in a file and
its threads, memory and open files readable from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.procs import ROOT, Exporter, free_port, track

FIXTURES = ROOT / "tests" / "fixtures" / "reliability"


class Node(Exporter):
    """``gpu-exporter --simulate FLEET`` whose output goes to ``log_path``."""

    def __init__(
        self,
        log_path: Path,
        *args: str,
        fleet: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        sim = ["--simulate", str(fleet)] if fleet else ["--simulate"]
        env = {**os.environ, "NODE_NAME": "sim-node", "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log_path, "w") as out:
            self.proc = track(
                subprocess.Popen(
                    [sys.executable, "-m", "exporter", *sim, "-a", f"127.0.0.1:{self.port}", *args],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )

    def output(self) -> str:
        return self.log_path.read_text()

    def status(self, field: str) -> int:
        """A number from /proc/<pid>/status: Threads, VmRSS (KiB), VmHWM (KiB)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise KeyError(field)

    def rss_mib(self) -> float:
        return self.status("VmRSS") / 1024

    def threads(self) -> int:
        return self.status("Threads")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def terminate(self, timeout: float = 10.0) -> float:
        """SIGTERM; seconds until the process exited (raises if it did not)."""
        t0 = time.monotonic()
        self.proc.terminate()
        self.proc.wait(timeout)
        return time.monotonic() - t0

    def connect(self, timeout: float = 5.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
