"""The HTTP limit flags: defaults, environment fallbacks, and bad values refused with one
line naming the input (the behaviour behind them: test_http.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from exporter.cli import build_parser, main
from exporter.config.model import (
    DEFAULT_HTTP_MAX_HEADER_BYTES,
    DEFAULT_HTTP_TIMEOUT_MS,
    DEFAULT_HTTP_WRITE_TIMEOUT_MS,
    DEFAULT_MAX_CONNECTIONS,
)
from exporter.config.resolve import config_from
from tests.procs import ROOT


def cfg(argv, env=None):
    return config_from(build_parser().parse_args(argv), env or {})


def test_defaults_flags_and_environment():
    c = cfg([])
    assert (c.max_connections, c.http_timeout_s) == (512, 15.0)
    assert (DEFAULT_MAX_CONNECTIONS, DEFAULT_HTTP_TIMEOUT_MS) == (512, 15000)
    env = {"GPU_EXPORTER_MAX_CONNECTIONS": "64", "GPU_EXPORTER_HTTP_TIMEOUT": "5000"}
    c = cfg([], env)
    assert (c.max_connections, c.http_timeout_s) == (64, 5.0)
    c = cfg(["--max-connections", "8", "--http-timeout", "250"], env)  # flags win
    assert (c.max_connections, c.http_timeout_s) == (8, 0.25)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-connections", "0"], "--max-connections: '0' is not a connection limit"),
        (["--max-connections", "lots"], "--max-connections: 'lots'"),
        (["--http-timeout", "50"], "--http-timeout: '50' is not a timeout in milliseconds"),
        (["--http-timeout", "1.5"], "give a number from 100 to 3600000"),
        (["--http-write-timeout", "0"], "--http-write-timeout: '0' is not a timeout"),
        (["--http-max-header-bytes", "10"], "--http-max-header-bytes: '10' is not a size"),
        (["--web-auth-exclude", "/etc"], "--web-auth-exclude: unknown path(s) /etc"),
    ],
)
def test_bad_values_exit_2_with_one_line(capsys, argv, needle):
    assert main(["--check", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err, err


def test_bad_environment_value_names_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("GPU_EXPORTER_MAX_CONNECTIONS", "-1")
    assert main(["--check"]) == 2
    assert "environment variable GPU_EXPORTER_MAX_CONNECTIONS" in capsys.readouterr().err


def test_write_timeout_header_budget_and_auth_exclusions():
    c = cfg([])
    assert (c.http_write_timeout_s, c.http_max_header_bytes) == (15.0, 16384)
    assert (DEFAULT_HTTP_WRITE_TIMEOUT_MS, DEFAULT_HTTP_MAX_HEADER_BYTES) == (15000, 16384)
    assert c.auth_excluded_paths == ("/health", "/ready")
    env = {
        "GPU_EXPORTER_HTTP_WRITE_TIMEOUT": "2000",
        "GPU_EXPORTER_HTTP_MAX_HEADER_BYTES": "4096",
        "GPU_EXPORTER_WEB_AUTH_EXCLUDE": "/health",
    }
    c = cfg([], env)
    assert (c.http_write_timeout_s, c.http_max_header_bytes) == (2.0, 4096)
    assert c.auth_excluded_paths == ("/health",)
    c = cfg(["--web-auth-exclude", ""], env)  # every path behind the password
    assert c.auth_excluded_paths == ()


def _start(address: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "--simulate", "-a", address, "-c", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_a_port_in_use_exits_2_with_one_line():
    """Not "serving on" then a traceback: one line naming the address, exit status 2."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = _start(f"127.0.0.1:{port}")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-2000:]
    assert "Traceback" not in out and "serving on" not in out
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], errors
    assert "cannot listen there" in errors[0] and "-a/--address" in errors[0]


def test_an_invalid_host_exits_2_with_one_line():
    p = _start("no-such-host.invalid:9400")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-2000:]
    assert "Traceback" not in out and "serving on" not in out
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "'no-such-host.invalid' is not a host" in errors[0], errors


def test_max_connections_help_and_docs_state_the_eviction_and_headroom(capsys):
    """What --help and docs/security.md tell a user is what the listener does."""
    from exporter.http.listener import ACCEPT_BATCH, ACCEPT_HEADROOM, BACKLOG

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "closes one never answered, oldest first" in help_text
    security = (ROOT / "docs" / "security.md").read_text()
    assert f"| sockets held past the limit | {ACCEPT_HEADROOM} (`ACCEPT_HEADROOM`)" in security
    assert f"at most {ACCEPT_BATCH} sockets per wake-up" in security
    assert f"| listen backlog | {BACKLOG} |" in security
    readme = (ROOT / "README.md").read_text()
    assert "past it a new one closes one never answered (oldest first)" in readme


def _open_files_limit(hard: int, tmp_path) -> tuple[int, str]:
    """(soft RLIMIT_NOFILE of an exporter started with soft 100 and ``hard``, its log)."""
    import resource
    import time

    from tests.procs import free_port

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))

    log = tmp_path / f"log-{hard}"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--simulate", "-a", f"127.0.0.1:{free_port()}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=lower,
        )  # fmt: skip
    try:
        end = time.monotonic() + 20
        while "serving on" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.05)
        with open(f"/proc/{proc.pid}/limits") as f:
            row = next(line for line in f if line.startswith("Max open files"))
    finally:
        proc.terminate()
        proc.wait(10)
    return int(row.split()[3]), log.read_text()


def test_the_open_files_limit_is_raised_for_max_connections(tmp_path):
    """A soft `ulimit -n` under what --max-connections needs is raised (as Go programs do);
    a hard limit under it is said in one line naming the flag."""
    import resource

    from exporter.http.listener import ACCEPT_HEADROOM, FD_SPARE

    need = DEFAULT_MAX_CONNECTIONS + ACCEPT_HEADROOM + FD_SPARE
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} < {need}: cannot show the limit raised")
    soft, log = _open_files_limit(hard, tmp_path)
    assert soft == need and "open files" not in log, log
    soft, log = _open_files_limit(200, tmp_path)
    assert soft == 200
    warned = [line for line in log.splitlines() if "open files" in line]
    assert len(warned) == 1, log
    assert f"--max-connections {DEFAULT_MAX_CONNECTIONS} needs {need} open files" in warned[0]
    assert "Traceback" not in log
