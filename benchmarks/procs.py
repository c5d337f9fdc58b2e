"""Real processes for the benchmarks and the tests: the exporter, Prometheus, any server.

The one harness both use (tests/procs.py adds the tests' skip for a missing tool):
every process logs to a file (its own, or an anonymous temporary one), so a chatty
process never blocks on a full pipe and its output can be read while it runs. CPU is
read from /proc (a process's utime + stime in clock ticks, or each thread's on-CPU
time in ns for a rate over a window) and memory from /proc/PID/status, so a load
client's own CPU is never counted as the server's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(
    url: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body bytes) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_until(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """The first true value of ``cond()`` within ``timeout`` s (OSError counts as false)."""
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = cond()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Thread ID -> (thread name, CPU seconds) of every live thread of ``pid``: the
    scheduler's on-CPU time in ns (/proc/.../schedstat) where the kernel keeps it, else
    utime + stime in clock ticks."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            try:
                with open(f"{base}/schedstat") as f:
                    cpu = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                fields = rest.split()
                cpu = (int(fields[11]) + int(fields[12])) * TICK_S
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (head.split("(", 1)[1], cpu)
    return out


def proc_status(pid: int, field: str) -> int:
    """A number from /proc/PID/status: Threads, VmRSS (KiB), VmHWM (KiB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"no {field} for pid {pid}")


def rss_mib(pid: int) -> float:
    """Resident set size in MiB (VmRSS)."""
    return proc_status(pid, "VmRSS") / 1024


class Process:
    """A server on 127.0.0.1:port, its output in ``log`` (or a temporary file).

    Stopped with SIGTERM, then SIGKILL after 10 s; usable as a context manager.
    """

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
        self._out: IO[bytes] = log.open("w+b") if log else tempfile.TemporaryFile()  # noqa: SIM115
        self._final = ""  # the output, kept when stop() closes the file
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def get(
        self, path: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0
    ) -> tuple[int, dict[str, str], bytes]:
        return http_get(self.url + path, headers, timeout)

    def wait_http(self, path: str, timeout: float = 60.0) -> None:
        """Wait until GET path answers 200 (or raise RuntimeError with the log's tail)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]} exited {self.proc.returncode}: {self.tail()}")
            try:
                if self.get(path, timeout=2.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.argv[:4]} not answering {path} after {timeout} s: {self.tail()}")

    def output(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        if self._out.closed:
            return self._final
        data, off = [], 0
        while chunk := os.pread(self._out.fileno(), 1 << 20, off):
            data.append(chunk)
            off += len(chunk)
        return b"".join(data).decode(errors="replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:]) or "(no output)"

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return rss_mib(self.pid)

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def status(self, field: str) -> int:
        """A number from /proc/PID/status: Threads, VmRSS (KiB), VmHWM (KiB)."""
        return proc_status(self.pid, field)

    def threads(self) -> int:
        return self.status("Threads")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def connect(self, timeout: float = 5.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def terminate(self, timeout: float = 10.0) -> float:
        """SIGTERM; seconds until the process exited (raises if it did not)."""
        t0 = time.monotonic()
        self.proc.terminate()
        self.proc.wait(timeout)
        return time.monotonic() - t0

    def stop(self) -> str:
        """SIGTERM (SIGKILL after 10 s) if still running; its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._out.closed:
            self._final = self.output()
            self._out.close()
        return self._final

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


STARTED: list[subprocess.Popen] = []
"""Every exporter process started here (tests/conftest.py fails a test that leaves one
running)."""


class Exporter(Process):
    """``gpu-exporter --simulate FLEET ARGS`` (``python -m exporter``, run by ``python``,
    default this interpreter) on a free port."""

    def __init__(
        self,
        *args: str,
        fleet: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        python: str | None = None,
    ) -> None:
        port = free_port()
        sim = ["--simulate", str(fleet)] if fleet else ["--simulate"]
        cmd = [python or sys.executable, "-m", "exporter", *sim, "-a", f"127.0.0.1:{port}"]
        super().__init__([*cmd, *args], port, env={"NODE_NAME": "sim-node", **(env or {})}, log=log)
        STARTED.append(self.proc)

    def metrics(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, (status, body[:300])
        return body.decode()

    def bodies(self) -> tuple[bytes, bytes]:
        """The exposition as served: (plain, gzip) bytes."""
        out = []
        for headers in ({}, {"Accept-Encoding": "gzip"}):
            status, _, body = self.get("/metrics", headers, timeout=10.0)
            if status != 200:
                raise RuntimeError(f"GET /metrics answered {status}: {body[:300]!r}")
            out.append(body)
        return out[0], out[1]

    def wait_metrics(
        self, pred: Callable[[str], object], timeout: float = 10.0, what: str = "metrics"
    ) -> str:
        """The first exposition for which ``pred(text)`` is true."""
        box: list[str] = []

        def check() -> object:
            box[:] = [self.metrics()]
            return pred(box[0])

        wait_until(check, timeout, what)
        return box[0]

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited: {self.output()}")
            return self.get("/ready")[0] == 200

        wait_until(ready, timeout, "the exporter to be ready")


def ours(
    fleet: Path, interval_ms: int, log: Path | None = None, extra: Sequence[str] = ()
) -> Exporter:
    """gpu-exporter on the simulated driver, exactly as a user starts it."""
    # the scrape benchmarks fire up to 50 requests at once: above the default limit of 16
    flags = ["-c", str(interval_ms), "--log-level", "warning", "--max-concurrent-scrapes", "64"]
    flags += extra
    return Exporter(*flags, fleet=fleet, env={"NODE_NAME": "bench-node"}, log=log)


PYTHON_COMMS = ("python", "python3", "asyncio_", "nvml_", "loop_")


def thread_group(pid: int, tid: int, comm: str) -> str:
    """The group of a thread of ``pid``: main (the event loop), python (the other threads
    Python started: the NVML worker first) or native (started by a C library)."""
    if tid == pid:
        return "main"
    if comm.startswith(PYTHON_COMMS):
        return "python"
    return "native"


def cpu_rates(proc: Process, seconds: float) -> dict[str, float]:
    """CPU seconds per second over a window of ``seconds``: the process (``process``) and
    each :func:`thread_group`.

    Summed per thread in ns (:func:`thread_cpu`): the process's own figure moves in clock
    ticks (10 ms), which over a 10 s window is +-2 ms per second, as much as the costs
    compared. A thread that started in the window counts whole; one that both started and
    ended in it is missed; when one present at the start has ended, the process rate is
    read in ticks instead and the groups are left out (the exporters measured keep their
    threads)."""
    a, c0, t0 = thread_cpu(proc.pid), proc.cpu(), time.monotonic()
    time.sleep(seconds)
    b, c1, elapsed = thread_cpu(proc.pid), proc.cpu(), time.monotonic() - t0
    if not a.keys() <= b.keys():
        return {"process": (c1 - c0) / elapsed}
    out = {"process": 0.0, "main": 0.0, "python": 0.0, "native": 0.0}
    for tid, (comm, cpu) in b.items():
        used = (cpu - a.get(tid, ("", 0.0))[1]) / elapsed
        out["process"] += used
        out[thread_group(proc.pid, tid, comm)] += used
    return out


def cpu_rate(proc: Process, seconds: float) -> float:
    """CPU seconds per second the process used over a window of ``seconds`` (:func:`cpu_rates`)."""
    return cpu_rates(proc, seconds)["process"]


class Prometheus(Process):
    """A real Prometheus server (``binary``) on a free port with a config and data dir."""

    def __init__(
        self, config: Path, workdir: Path, extra: tuple[str, ...] = (), binary: str = "prometheus"
    ) -> None:
        port = free_port()
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            *extra,
        ]
        self.logfile = workdir / "prometheus.log"
        super().__init__(argv, port, log=self.logfile)
        wait_until(lambda: self.get("/-/ready")[0] == 200, 30, "Prometheus ready")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query."""
        status, _, body = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert status == 200, body
        return json.loads(body)["data"]["result"]
