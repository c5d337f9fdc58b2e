"""The kubelet client's grpc settings, as a fresh exporter process gets them."""

import os
import subprocess
import sys

import pytest

from exporter.kube import podresources

SHOW = (
    "import os, exporter.kube.podresources as p; "
    "print(os.environ.get('GRPC_EXPERIMENTS', '')); print(p._grpc_version())"
)


def _fresh(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        env={**env, **env_extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.skipif(
    not (1, 85) <= podresources._grpc_version() < (1, 86),
    reason="the legacy client is chosen only on the grpcio versions it was measured on (1.85)",
)
def test_legacy_client_chosen_without_an_error_line() -> None:
    r = _fresh({})
    assert r.stdout.splitlines()[0] == podresources.LEGACY_CLIENT
    assert r.stderr == ""  # grpc knows the experiment: no "Unknown experiment" line


def test_users_grpc_experiments_kept() -> None:
    r = _fresh({"GRPC_EXPERIMENTS": "-event_engine_listener"})
    assert r.stdout.splitlines()[0] == "-event_engine_listener"


def test_grpc_version_read_without_importing_grpc() -> None:
    major, minor = podresources._grpc_version()
    import grpc

    assert grpc.__version__.startswith(f"{major}.{minor}.")
