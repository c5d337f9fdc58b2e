"""Exporter processes under test, and what /proc says about them.

CPU is read from /proc/PID/stat (utime + stime of every thread, in clock
ticks) and memory from /proc/PID/status (VmRSS), so the load client's own CPU
is never counted as the exporter's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def rss_mib(pid: int) -> float:
    """Resident set size in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Process:
    """A server under test on 127.0.0.1:port; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log
        out = log.open("w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def wait_http(self, path: str, timeout: float = 60.0) -> None:
        """Wait until GET path answers 200 (or raise with the log's tail)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]} exited {self.proc.returncode}: {self.tail()}")
            try:
                if http_get(self.url + path, timeout=2.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.argv[:4]} not answering {path} after {timeout} s: {self.tail()}")

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mib(self.pid)

    def tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ours(
    fleet: Path, interval_ms: int, log: Path | None = None, extra: Sequence[str] = ()
) -> Process:
    """gpu-exporter on the simulated driver, exactly as a user starts it."""
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "--simulate", str(fleet)]
    argv += ["-a", f"127.0.0.1:{port}", "-c", str(interval_ms), "--log-level", "warning"]
    argv += extra
    return Process(argv, port, env={"NODE_NAME": "bench-node"}, log=log)


def cpu_rate(proc: Process, seconds: float) -> float:
    """CPU seconds per second the process used over a window of `seconds`."""
    c0, t0 = proc.cpu(), time.monotonic()
    time.sleep(seconds)
    return (proc.cpu() - c0) / (time.monotonic() - t0)
