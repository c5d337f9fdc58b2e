"""The kubelet client against grpc-go, the gRPC the kubelet's pod-resources server runs:
tests/workloads/kubelet/gokubelet/main.go, built here from Debian's golang-go and
golang-google-grpc-dev (grpc-go 1.33, GOPATH mode, offline), answers List and stops
with GracefulStop on SIGTERM, as the kubelet does when it shuts down."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import PodResourcesClient

pytestmark = pytest.mark.slow  # builds a Go program (seconds once Go's build cache is warm)

SOURCE = Path(__file__).parent / "gokubelet" / "main.go"
GOCODE = Path("/usr/share/gocode")
ANSWER = pb.ListPodResourcesResponse(
    pod_resources=[pb.PodResources(name="train-0", namespace="ml")]
).SerializeToString()


@pytest.fixture(scope="module")
def gokubelet(tmp_path_factory) -> Path:
    """The server's binary, built once per test module."""
    go = shutil.which("go")
    if go is None or not (GOCODE / "src" / "google.golang.org" / "grpc").is_dir():
        pytest.skip("grpc-go not installed: apt-get install golang-go golang-google-grpc-dev")
    work = tmp_path_factory.mktemp("gokubelet")
    env = {
        **os.environ,
        "GO111MODULE": "off",  # Debian's packages are a GOPATH tree
        "GOPATH": f"{work / 'gopath'}:{GOCODE}",
        "GOPROXY": "off",
        "GOFLAGS": "",
    }
    out = work / "gokubelet"
    r = subprocess.run(
        [go, "build", "-o", str(out), str(SOURCE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


class Server:
    """The grpc-go server on a unix socket, answering after ``delay_ms``."""

    def __init__(self, binary: Path, work: Path, delay_ms: int = 0) -> None:
        (work / "answer").write_bytes(ANSWER)
        self.socket = work / "kubelet.sock"
        self.proc = subprocess.Popen(
            [str(binary), str(self.socket), str(work / "answer"), str(delay_ms)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "serving"

    async def graceful_stop(self) -> float:
        """SIGTERM, then the seconds its GracefulStop took (as it reports them)."""
        self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None:
            await asyncio.sleep(0.02)  # the client's event loop keeps running
        assert self.proc.stdout is not None
        line = self.proc.stdout.read().strip()
        assert line.startswith("stopped in "), line
        return float(line.split()[2])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def server(gokubelet, tmp_path):
    made: list[Server] = []

    def start(delay_ms: int = 0) -> Server:
        made.append(Server(gokubelet, tmp_path, delay_ms))
        return made[-1]

    yield start
    for s in made:
        s.close()


async def test_list_from_grpc_go(server):
    s = server()
    client = PodResourcesClient(str(s.socket), timeout_s=5)
    for _ in range(3):
        assert await client.list_bytes() == ANSWER
    await client.close()


async def test_graceful_stop_is_not_held_by_an_idle_client(server):
    s = server()
    client = PodResourcesClient(str(s.socket), timeout_s=5)
    assert await client.list_bytes() == ANSWER  # then idle, its connection open
    started = time.monotonic()
    took = await s.graceful_stop()
    assert took < 1.0 and time.monotonic() - started < 2.0
    await client.close()


async def test_a_call_in_flight_finishes_across_graceful_stop(server):
    s = server(delay_ms=1000)
    client = PodResourcesClient(str(s.socket), timeout_s=5)
    assert await client.list_bytes() == ANSWER
    call = asyncio.create_task(client.list_bytes())
    await asyncio.sleep(0.3)  # the call is in flight
    stop = asyncio.create_task(s.graceful_stop())
    assert await call == ANSWER
    assert await stop < 2.0  # the call's second, then the server goes
    await client.close()
