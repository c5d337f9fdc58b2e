"""Flags and environment resolved into one Config: flag, then variable, then default."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import build_parser, main
from exporter.config.model import ConfigError, DeviceSelection, parse_bool, parse_devices
from exporter.config.resolve import config_from
from tests.procs import free_port

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def cfg(argv, env=None):
    return config_from(build_parser().parse_args(argv), env or {})


def test_defaults_match_dcgm_exporter():
    c = cfg([], {"NODE_NAME": "node-a"})
    assert (c.host, c.port, c.interval_s) == ("", 9400, 30.0)
    assert c.hostname == "node-a"
    assert c.hostname_label == "hostname"  # dcgm-exporter 4.8.4's, the release mimicked
    assert c.metrics_file.endswith("metrics.csv")
    assert c.collect_timeout_s == 10.0
    assert c.devices == DeviceSelection("f", None)
    assert (c.xid_window_s, c.clock_events_window_s) == (300.0, 300.0)
    assert (c.no_hostname, c.old_names, c.replace_blanks_in_model_name) == (False,) * 3
    assert (c.log_level, c.log_format, c.no_effect, c.kube) == ("info", "text", (), None)


def test_environment_fallbacks_and_flag_precedence():
    env = {
        "DCGM_EXPORTER_LISTEN": "127.0.0.1:9500",
        "DCGM_EXPORTER_INTERVAL": "1000",
        "DCGM_EXPORTER_COLLECTORS": str(FIXTURES / "dcgm-default-counters.csv"),
        "GPU_EXPORTER_HOSTNAME_LABEL": "Hostname",
        "DCGM_EXPORTER_NO_HOSTNAME": "false",
        "DCGM_EXPORTER_DEVICES_STR": "g:0,1",
    }
    c = cfg([], env)
    assert (c.host, c.port, c.interval_s, c.collect_timeout_s) == ("127.0.0.1", 9500, 1.0, 1.0)
    assert c.metrics_file.endswith("dcgm-default-counters.csv")
    assert c.hostname_label == "Hostname"
    assert (c.no_hostname, c.devices) == (False, DeviceSelection("g", frozenset({0, 1})))
    c = cfg(["-a", "[::1]:9401", "-c", "500", "-n", "-d", "i"], env)
    assert (c.host, c.port, c.interval_s) == ("::1", 9401, 0.5)
    assert (c.no_hostname, c.devices) == (True, DeviceSelection("i", None))


def test_empty_environment_values_count_as_unset():
    c = cfg([], {"DCGM_EXPORTER_LISTEN": "", "DCGM_EXPORTER_KUBERNETES": "", "NODE_NAME": "n"})
    assert (c.port, c.kube) == (9400, None)


@pytest.mark.parametrize(
    ("text", "value"),
    [(t, True) for t in ("1", "t", "T", "TRUE", "true", "True")]
    + [(f, False) for f in ("0", "f", "F", "FALSE", "false", "False")],
)
def test_go_booleans(text, value):
    assert parse_bool(text, "X") is value
    c = cfg([], {"DCGM_EXPORTER_USE_OLD_NAMESPACE": text})
    assert c.old_names is value


@pytest.mark.parametrize("text", ["yes", "on", "2", "tRuE", "enabled"])
def test_non_go_booleans_are_errors_naming_the_variable(text):
    with pytest.raises(ConfigError, match=r"environment variable DCGM_EXPORTER_DEBUG: .* boolean"):
        cfg([], {"DCGM_EXPORTER_DEBUG": text})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("f", DeviceSelection("f", None)),
        ("g", DeviceSelection("g", None)),
        ("i", DeviceSelection("i", None)),
        ("g:0,1", DeviceSelection("g", frozenset({0, 1}))),
        ("i:0,2-4", DeviceSelection("i", frozenset({0, 2, 3, 4}))),
    ],
)
def test_devices(value, expected):
    assert parse_devices(value, "-d/--devices") == expected


@pytest.mark.parametrize("value", ["x", "f:0", "g:", "g:a", "i:4-2", "g:0,,1", "g:99999"])
def test_bad_devices(value):
    with pytest.raises(ConfigError, match=r"-d/--devices: .* use f, g, i"):
        cfg(["-d", value])


def test_windows_debug_json_and_old_names():
    c = cfg(["-x", "60000", "--clock-events-count-window-size", "1000", "--debug", "-o"])
    assert (c.xid_window_s, c.clock_events_window_s) == (60.0, 1.0)
    assert (c.log_level, c.old_names) == ("debug", True)
    c = cfg(["-rbmn", "--log-format", "json", "--log-level", "warning"])
    assert (c.replace_blanks_in_model_name, c.log_format, c.log_level) == (True, "json", "warning")


def test_go_spellings_of_flags():
    """dcgm-exporter's Go parser takes one or two dashes on any flag name."""
    c = cfg(["-address", "127.0.0.1:9401", "--c=500", "-no-hostname", "--rbmn", "-debug"])
    assert (c.host, c.port, c.interval_s) == ("127.0.0.1", 9401, 0.5)
    assert (c.no_hostname, c.replace_blanks_in_model_name, c.log_level) == (True, True, "debug")
    c = cfg(["--kubernetes=false", "-n=False", "--debug=0"], {"DCGM_EXPORTER_NO_HOSTNAME": "1"})
    assert (c.kube, c.no_hostname, c.log_level) == (None, False, "info")  # the flag wins
    assert cfg(["-collectors=" + str(FIXTURES / "bad-columns.csv")]).metrics_file.endswith(
        "bad-columns.csv"
    )


def test_simulate_environment():
    assert cfg([], {"GPU_EXPORTER_SIMULATE": "false"}).simulate is False
    assert cfg([], {"GPU_EXPORTER_SIMULATE": "0"}).simulate is False
    c = cfg([], {"GPU_EXPORTER_SIMULATE": "true"})
    assert (c.simulate, c.fleet) == (True, None)
    fleet = str(Path(__file__).parents[2] / "exporter" / "sim" / "fleets" / "default.yaml")
    c = cfg([], {"GPU_EXPORTER_SIMULATE": fleet})
    assert (c.simulate, c.fleet) == (True, fleet)
    assert cfg(["--simulate"], {"GPU_EXPORTER_SIMULATE": "false"}).simulate is True


def test_kubernetes_flags():
    c = cfg(
        [
            "-k",
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex",
            "^app$,team.*",
            "--kubernetes-virtual-gpus",
        ],
        {"KUBERNETES_ENABLE_DRA": "true", "NODE_NAME": "n"},
    )
    k = c.kube
    assert k is not None and k.node_name == "n"
    assert (k.dcgm_pod_labels, k.pod_label_allowlist) == (True, ("^app$", "team.*"))
    assert (k.virtual_gpus, k.dra) == (True, True)
    k = cfg(["-k", "--kubernetes-dra"]).kube
    assert k is not None and k.dra and not k.dcgm_pod_labels
    assert cfg([], {"DCGM_EXPORTER_KUBERNETES": "True"}).kube is not None


def test_dcgm_only_flags_are_named_as_without_effect():
    c = cfg(["-r", "host:5555", "--fake-gpus"], {"DCGM_EXPORTER_DUMP_ENABLED": "1"})
    assert c.no_effect == ("--remote-hostengine-info", "--fake-gpus", "--dump-enabled")
    assert cfg([], {"DCGM_EXPORTER_DUMP_ENABLED": "0"}).no_effect == ("--dump-enabled",)


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
        ([], {"GPU_EXPORTER_LOG_LEVEL": "verbose"}, "GPU_EXPORTER_LOG_LEVEL: 'verbose' is not"),
        (["--log-format", "xml"], {}, "--log-format: 'xml' is not a log format"),
        (["-x", "0"], {}, "-x/--xid-count-window-size: '0' is not a window"),
        (["-k", "--kubernetes-pod-label-allowlist-regex", "a,("], {}, "allowlist-regex: '('"),
        (["-k", "--kubernetes-pod-label-allowlist-regex", "a," * 101], {}, "give at most 100"),
        ([], {"DCGM_EXPORTER_USE_FAKE_GPUS": "nope"}, "DCGM_EXPORTER_USE_FAKE_GPUS: 'nope'"),
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


def check(*argv):
    return run("--check", "-a", f"127.0.0.1:{free_port()}", *argv)


def test_check_mode_reports_served_and_skipped_fields():
    p = check("-f", str(FIXTURES / "dcgm-default-counters.csv"))
    assert (p.returncode, p.stderr) == (0, "")
    lines = p.stdout.splitlines()
    assert lines[0].startswith("ok: 26 metrics, 1 label fields: DCGM_FI_DEV_SM_CLOCK")
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in lines[1]
    assert "not available through NVML" in lines[1]
    assert all(len(line) <= 200 for line in lines)


def test_check_mode_summarises_long_lists():
    p = check("-f", str(FIXTURES / "dcgm-all-fields.csv"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line) <= 200 for line in lines), lines
    unknown = next(line for line in lines if "a DCGM field NVML cannot serve" in line)
    assert "DCGM_FI_UNKNOWN" in unknown
    assert unknown.endswith(" more")


def test_version():
    for flag in ("-v", "--version"):
        p = run(flag)
        assert p.returncode == 0
        assert p.stdout.startswith("gpu-exporter ")


def test_help_shows_both_groups_with_every_variable():
    from exporter.config.dcgmflags import DCGM_FLAGS

    text = build_parser().format_help()
    assert "dcgm-exporter flags:" in text and "gpu-exporter flags:" in text
    for f in DCGM_FLAGS:
        assert f"--{f.long}" in text and f.env in text
    for s in ("--simulate", "--hostname-label", "GPU_EXPORTER_SIMULATE", "--check"):
        assert s in text


def test_main_returns_2_in_process(capsys):
    assert main(["-a", "nope"]) == 2
    assert "is not an address" in capsys.readouterr().err


def test_accounting_flags_and_their_variables():
    c = cfg(["--accounting-idle-threshold", "5", "--accounting-retention", "60000"])
    assert (c.accounting_idle_below, c.accounting_retention_s) == (0.05, 60.0)
    env = {"GPU_EXPORTER_ACCOUNTING_IDLE_THRESHOLD": "0", "GPU_EXPORTER_ACCOUNTING_RETENTION": "0"}
    c = cfg([], env)
    assert (c.accounting_idle_below, c.accounting_retention_s) == (0.0, 0.0)
    c = cfg([])
    assert (c.accounting_idle_below, c.accounting_retention_s) == (0.01, 120.0)


def test_the_accounting_state_dir(tmp_path):
    assert cfg([]).accounting_state_dir == ""
    c = cfg([], {"GPU_EXPORTER_ACCOUNTING_STATE_DIR": str(tmp_path / "state")})
    assert c.accounting_state_dir == str(tmp_path / "state")  # made at the first write
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'file'} is not a directory")):
        cfg(["--accounting-state-dir", str(tmp_path / "file")])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--accounting-idle-threshold", "101"], "--accounting-idle-threshold: '101'"),
        (["--accounting-idle-threshold", "half"], "--accounting-idle-threshold: 'half'"),
        (["--accounting-retention", "-1"], "--accounting-retention: '-1'"),
    ],
)
def test_bad_accounting_flags_name_the_flag(argv, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        cfg(argv)
