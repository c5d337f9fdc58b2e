"""-k without the optional "kube" extra installed: one clear line, exit 2, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import free_port

ROOT = Path(__file__).parents[1]

# The exporter's CLI in a Python where one package of the extra cannot be imported.
BLOCKED = """
import sys
sys.modules[{module!r}] = None  # what Python does for a package that is not installed
from exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start(tmp_path: Path, python: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """The exporter with -k (``python`` picks the interpreter's arguments) against a kubelet
    socket that accepts connections, so that an import is the only thing that can fail."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "kubelet.sock"))
    sock.listen(4)
    argv = ["--simulate", "-k", "--pod-resources-kubelet-socket", str(tmp_path / "kubelet.sock")]
    argv += ["-a", f"127.0.0.1:{free_port()}", *(["--check"] if check else [])]
    try:
        return subprocess.run(
            [sys.executable, *python, *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("module", "dist", "check"),
    [
        ("h2", "h2", True),
        ("h2", "h2", False),  # a plain start stops before serving
        ("hpack", "hpack", True),  # h2's own dependencies: named, not h2
        ("hyperframe", "hyperframe", True),
        ("google.protobuf", "protobuf", True),
        ("google.protobuf", "protobuf", False),
    ],
)
def test_k_without_the_kube_extra_names_the_install(
    tmp_path: Path, module: str, dist: str, check: bool
) -> None:
    r = _start(tmp_path, ["-c", BLOCKED.format(module=module)], check)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"gpu-exporter: error: -k (--kubernetes) needs the Python package {dist} "
        f"({module} cannot be imported): pip install gpu-exporter[kube]"
    ]
    assert "Traceback" not in r.stdout + r.stderr


def test_k_needs_no_grpcio(tmp_path: Path) -> None:
    # the kubelet client is gRPC over h2 (exporter/workloads/kubelet/grpcclient.py); grpcio is
    # for the tests' fake kubelet
    r = _start(tmp_path, ["-c", BLOCKED.format(module="grpc")])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_k_with_the_extra_installed_passes_the_check(tmp_path: Path) -> None:
    r = _start(tmp_path, ["-m", "exporter"])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_without_k_neither_h2_nor_protobuf_is_imported() -> None:
    code = (
        "import sys, exporter.app, exporter.cli, exporter.poller; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('h2', 'hpack', 'hyperframe', 'google', 'grpc')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
