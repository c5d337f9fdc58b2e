"""Flags and environment: one clear line and exit code 2 for bad input."""

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import build_parser, config_from, main
from exporter.config import ConfigError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def cfg(argv, env=None):
    return config_from(build_parser().parse_args(argv), env or {})


def test_defaults_match_dcgm_exporter():
    c = cfg([], {"NODE_NAME": "node-a"})
    assert (c.host, c.port, c.interval_s) == ("", 9400, 30.0)
    assert c.hostname == "node-a"
    assert c.hostname_label == "Hostname"
    assert c.metrics_file.endswith("metrics.csv")
    assert c.collect_timeout_s == 10.0


def test_environment_fallbacks_and_flag_precedence():
    env = {
        "DCGM_EXPORTER_LISTEN": "127.0.0.1:9500",
        "DCGM_EXPORTER_INTERVAL": "1000",
        "DCGM_EXPORTER_COLLECTORS": str(FIXTURES / "dcgm-default-counters.csv"),
        "GPU_EXPORTER_HOSTNAME_LABEL": "hostname",
    }
    c = cfg([], env)
    assert (c.host, c.port, c.interval_s, c.collect_timeout_s) == ("127.0.0.1", 9500, 1.0, 1.0)
    assert c.metrics_file.endswith("dcgm-default-counters.csv")
    assert c.hostname_label == "hostname"
    c = cfg(["-a", "[::1]:9401", "-c", "500"], env)
    assert (c.host, c.port, c.interval_s) == ("::1", 9401, 0.5)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["-a", "9400"], {}, "-a/--address: '9400' is not an address"),
        (["-a", ":99999"], {}, "-a/--address: ':99999' is not an address"),
        ([], {"DCGM_EXPORTER_LISTEN": "x"}, "environment variable DCGM_EXPORTER_LISTEN: 'x'"),
        (["-c", "fast"], {}, "-c/--collect-interval: 'fast' is not a collection interval"),
        (["-c", "10"], {}, "at least 100"),
        ([], {"DCGM_EXPORTER_INTERVAL": "-5"}, "environment variable DCGM_EXPORTER_INTERVAL"),
        (["-f", "/nonexistent.csv"], {}, "-f/--collectors: metrics file '/nonexistent.csv'"),
        (["--simulate", "/no/fleet.yaml"], {}, "--simulate: fleet file '/no/fleet.yaml'"),
        ([], {"GPU_EXPORTER_HOSTNAME_LABEL": "node"}, "GPU_EXPORTER_HOSTNAME_LABEL: 'node'"),
    ],
)
def test_bad_values_name_the_input(argv, env, message):
    with pytest.raises(ConfigError) as e:
        cfg(argv, env)
    assert message in str(e.value)


def run(*argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "exporter", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--interval-typo", "5"], "unrecognized arguments: --interval-typo"),
        (["-c", "abc"], "-c/--collect-interval: 'abc'"),
        (["--hostname-label", "HOST"], "invalid choice: 'HOST'"),
        (["-f", str(FIXTURES / "bad-columns.csv")], "bad-columns.csv:3: expected 3"),
        (["-f", str(FIXTURES / "unknown-field.csv")], "unknown-field.csv:2: unknown field"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle):
    p = run(*argv)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpu-exporter: error: ")
    assert needle in lines[0]


def test_check_mode_reports_and_names_skipped_fields():
    p = run("--check", "-f", str(FIXTURES / "dcgm-default-counters.csv"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ok: 26 metrics, 1 label fields")
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in p.stderr
    assert "not available through NVML" in p.stderr


def test_help_documents_every_flag_and_env():
    text = build_parser().format_help()
    for s in (
        "--address",
        "DCGM_EXPORTER_LISTEN",
        "--collect-interval",
        "DCGM_EXPORTER_INTERVAL",
        "--collectors",
        "DCGM_EXPORTER_COLLECTORS",
        "--simulate",
        "--hostname-label",
    ):
        assert s in text


def test_main_returns_2_in_process(capsys):
    assert main(["-a", "nope"]) == 2
    assert "is not an address" in capsys.readouterr().err
