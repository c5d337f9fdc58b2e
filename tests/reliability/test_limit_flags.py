"""The HTTP limit flags: defaults, environment fallbacks, and bad values refused with one
line naming the input (the behaviour behind them: test_http.py)."""

from __future__ import annotations

import pytest

from exporter.cli import build_parser, config_from, main
from exporter.config import DEFAULT_HTTP_TIMEOUT_MS, DEFAULT_MAX_CONNECTIONS


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
