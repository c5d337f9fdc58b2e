"""Real processes the end-to-end tests start: the exporter, Prometheus, Alertmanager."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).parent.parent

STARTED: list[subprocess.Popen] = []
"""Every exporter process the tests started (tests/conftest.py fails a test that leaves
one running)."""


def track(proc: subprocess.Popen) -> subprocess.Popen:
    """Register an exporter process for the leftover check in tests/conftest.py."""
    STARTED.append(proc)
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0):
    """(status, headers, body bytes) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_until(cond, timeout: float, what: str, interval: float = 0.05):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = cond()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Exporter:
    """``gpu-exporter --simulate FLEET`` as a subprocess on a free port, run by ``python``
    (default: the interpreter running the tests)."""

    def __init__(
        self,
        *args: str,
        fleet: str | Path | None = None,
        env: dict | None = None,
        python: str | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sim = ["--simulate", str(fleet)] if fleet else ["--simulate"]
        self.log = open(os.devnull, "w")  # noqa: SIM115
        self.log_path = None
        e = {**os.environ, "NODE_NAME": "sim-node", "PYTHONUNBUFFERED": "1", **(env or {})}
        cmd = [python or sys.executable, "-m", "exporter", *sim, "-a", f"127.0.0.1:{self.port}"]
        self.proc = track(
            subprocess.Popen(
                [*cmd, *args],
                cwd=ROOT,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )

    def get(self, path: str, headers: dict[str, str] | None = None):
        return http_get(self.url + path, headers)

    def metrics(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200
        return body.decode()

    def wait_metrics(self, pred, timeout: float = 10.0, what: str = "metrics") -> str:
        """The first exposition for which ``pred(text)`` is true."""
        box: list[str] = []

        def check():
            box[:] = [self.metrics()]
            return pred(box[0])

        wait_until(check, timeout, what)
        return box[0]

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited: {self.output()}")
            return self.get("/ready")[0] == 200

        wait_until(ready, timeout, "the exporter to be ready")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.output()

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stdout.read() if self.proc.stdout else ""


def require(tool: str, package: str) -> str:
    import pytest

    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not installed: apt-get install {package} (.ci/run does)")
    return path


class Prometheus:
    """A real Prometheus server on a free port with a given config and data dir."""

    def __init__(self, config: Path, workdir: Path, extra: tuple[str, ...] = ()):
        binary = require("prometheus", "prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logfile = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                *extra,
            ],
            stdout=self.logfile.open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: http_get(self.url + "/-/ready")[0] == 200, 30, "Prometheus ready")

    def query(self, expr: str) -> list[dict]:
        import json
        import urllib.parse

        status, _, body = http_get(
            self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        )
        assert status == 200, body
        return json.loads(body)["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
