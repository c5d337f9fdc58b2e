"""Every bad input a new user can give, through the real command line: exit status 2,
one line on stderr naming the input, no traceback, nothing served."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT, free_port

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def start(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Start the exporter; bad input must stop it long before the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "n", **(env or {})},
        timeout=30,
    )


def assert_refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert 1 <= len(lines) <= 3, p.stderr
    assert lines[0].startswith("gpu-exporter: error: ")
    assert len(lines[0]) <= len("gpu-exporter: error: ") + 400
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "serving" not in p.stderr


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "empty.csv").write_text("# only comments\n\n")
    (tmp_path / "latin1.csv").write_bytes(b"DCGM_FI_DEV_GPU_TEMP, gauge, \xe9\n")
    (tmp_path / "web.yml").write_text("tls_server_config: [unclosed\n")
    (tmp_path / "web-keys.yml").write_text("basic_auth_users: {admin: notabcrypthash}\nx: 1\n")
    (tmp_path / "fleet.yaml").write_text("gpus: [unclosed\n")
    (tmp_path / "fleet-bad.yaml").write_text("gpus:\n  - model: NoSuchGPU\n")
    return tmp_path


CASES = [
    (["--interval-typo", "5"], {}, ["unrecognized arguments: --interval-typo"]),
    (["--kube"], {}, ["unrecognized arguments: --kube"]),  # no abbreviations
    (["--no-hostname=maybe"], {}, ["--no-hostname: 'maybe' is not a boolean"]),
    (["-c", "abc"], {}, ["-c/--collect-interval: 'abc'"]),
    ([], {"DCGM_EXPORTER_INTERVAL": "-5"}, ["environment variable DCGM_EXPORTER_INTERVAL"]),
    (["-a", "9400"], {}, ["-a/--address: '9400'"]),
    (["-a", "999.1.1.1:9400"], {}, ["-a/--address", "'999.1.1.1' is not a host"]),
    ([], {"DCGM_EXPORTER_LISTEN": "x"}, ["environment variable DCGM_EXPORTER_LISTEN"]),
    (["-a", "127.0.0.1:" + "9" * 5000], {}, ["-a/--address"]),  # long values are cut
    (["-f", "/nonexistent.csv"], {}, ["-f/--collectors", "/nonexistent.csv"]),
    ([], {"DCGM_EXPORTER_COLLECTORS": "/no.csv"}, ["DCGM_EXPORTER_COLLECTORS", "/no.csv"]),
    (["-f", "{t}/empty.csv"], {}, ["empty.csv: the metrics file has no rows"]),
    (["-f", "{t}/latin1.csv"], {}, ["latin1.csv: not UTF-8"]),
    (["-f", str(FIXTURES / "bad-columns.csv")], {}, ["bad-columns.csv:3: expected 3"]),
    (["--web-config-file", "/no/web.yml"], {}, ["--web-config-file", "/no/web.yml"]),
    (["--web-config-file", "{t}/web.yml"], {}, ["web.yml", "YAML"]),
    (["--web-config-file", "{t}/web-keys.yml"], {}, ["web-keys.yml"]),
    (["--simulate", "/no/fleet.yaml"], {}, ["--simulate: fleet file '/no/fleet.yaml'"]),
    (["--simulate", "{t}/fleet.yaml"], {}, ["--simulate", "fleet.yaml"]),
    (["--simulate", "{t}/fleet-bad.yaml"], {}, ["--simulate", "fleet-bad.yaml"]),
    ([], {"GPU_EXPORTER_SIMULATE": "/no/fleet.yaml"}, ["GPU_EXPORTER_SIMULATE"]),
    ([], {"GPU_EXPORTER_LOG_LEVEL": "verbose"}, ["GPU_EXPORTER_LOG_LEVEL: 'verbose'"]),
    (["--log-level", "verbose"], {}, ["--log-level", "'verbose'"]),
    (["--log-format", "xml"], {}, ["--log-format: 'xml'"]),
    ([], {"DCGM_EXPORTER_KUBERNETES": "yes"}, ["DCGM_EXPORTER_KUBERNETES: 'yes'", "boolean"]),
    ([], {"DCGM_EXPORTER_NO_HOSTNAME": "maybe"}, ["DCGM_EXPORTER_NO_HOSTNAME: 'maybe'"]),
    ([], {"DCGM_EXPORTER_ENABLE_PPROF": "on"}, ["DCGM_EXPORTER_ENABLE_PPROF: 'on'"]),
    (["-d", "x:1"], {}, ["-d/--devices: 'x:1'"]),
    ([], {"DCGM_EXPORTER_DEVICES_STR": "g:3-1"}, ["DCGM_EXPORTER_DEVICES_STR: 'g:3-1'"]),
    (["-x", "0"], {}, ["-x/--xid-count-window-size: '0'"]),
    (["--clock-events-count-window-size", "soon"], {}, ["--clock-events-count-window-size"]),
    (["-k", "--kubernetes-pod-label-allowlist-regex", "("], {}, ["allowlist-regex: '('"]),
    (["-k", "--kubernetes-pod-labels", "[a"], {}, ["--kubernetes-pod-labels: '[a'"]),
    (["-k", "--kubernetes-gpu-id-type", "serial"], {}, ["--kubernetes-gpu-id-type: 'serial'"]),
    (["--hostname-label", "HOST"], {}, ["invalid choice: 'HOST'"]),
    ([], {"GPU_EXPORTER_HOSTNAME_LABEL": "node"}, ["GPU_EXPORTER_HOSTNAME_LABEL: 'node'"]),
    (["--max-connections", "0"], {}, ["--max-connections: '0'"]),
    ([], {"GPU_EXPORTER_HTTP_TIMEOUT": "1"}, ["GPU_EXPORTER_HTTP_TIMEOUT: '1'"]),
]


@pytest.mark.parametrize(("argv", "env", "needles"), CASES)
def test_bad_input_exits_2_with_one_line(files: Path, argv, env, needles):
    argv = [a.replace("{t}", str(files)) for a in argv]
    if not any(a.startswith("-a") for a in argv) and "DCGM_EXPORTER_LISTEN" not in env:
        argv = ["-a", f"127.0.0.1:{free_port()}", *argv]
    assert_refused(start(*argv, env=env), *needles)


def test_port_in_use_exits_2_before_serving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = start("--simulate", "-a", f"127.0.0.1:{port}")
    assert_refused(p, f"-a/--address: 127.0.0.1:{port}", "cannot listen there")


def test_check_reports_each_problem_on_its_own_line(files: Path):
    p = start(
        "--check",
        "-a",
        f"127.0.0.1:{free_port()}",
        "-f",
        str(files / "empty.csv"),
        "--web-config-file",
        str(files / "web.yml"),
        "--simulate",
        str(files / "fleet.yaml"),
        "-k",
        "--pod-resources-kubelet-socket",
        str(files / "no-kubelet.sock"),
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr
    assert [line.removeprefix("gpu-exporter: error: ").split(":")[0] for line in lines] == [
        str(files / "empty.csv"),
        "--web-config-file",
        "--simulate",
        "--pod-resources-kubelet-socket",
    ]
    assert all(len(line) <= len("gpu-exporter: error: ") + 400 for line in lines)


def test_check_passes_with_a_reachable_kubelet_socket(tmp_path: Path):
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as kubelet:
        kubelet.bind(str(path))
        kubelet.listen()
        p = start(
            "--check",
            "-a",
            f"127.0.0.1:{free_port()}",
            "-k",
            "--pod-resources-kubelet-socket",
            str(path),
        )
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout.startswith("ok: ")
