"""A stand-in kubelet for the pods dimension: pod-resources ``List`` on a unix socket.

    python -m benchmarks.kubelet SOCKET PODS.json

Serves ``v1.PodResourcesLister`` (List and GetAllocatableResources) from a JSON
file shaped like ``benchmarks.pods.assignments()``, read again whenever the
file changes, so a benchmark can churn pods (and follow MIG layouts) by
rewriting it. A process of its own: its CPU is never the exporter's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from benchmarks.pods import assignments
from exporter.sim import kubelet as sim_kubelet
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.generated import podresources_pb2_grpc as pb_grpc


def response(data: dict[str, Any]) -> pb.ListPodResourcesResponse:
    """A pods mapping (benchmarks.pods.assignments) as a List answer."""
    return sim_kubelet.response(data["pod_resources"])


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.mtime = -1
        self.answer = pb.ListPodResourcesResponse()

    def _current(self) -> pb.ListPodResourcesResponse:
        with self.lock:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime != self.mtime:
                self.answer = response(json.loads(self.path.read_text()))
                self.mtime = mtime
            return self.answer

    def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        return self._current()

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        out = pb.AllocatableResourcesResponse()
        for pod in self._current().pod_resources:
            for c in pod.containers:
                out.devices.extend(c.devices)
        return out


def serve(socket: Path, pods: Path) -> grpc.Server:
    """A started server on ``socket`` answering from ``pods`` (read again when it changes)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(pods), server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    return server


def serve_devices(socket: Path, ids: list[str]) -> grpc.Server:
    """A started server on ``socket`` where each of ``ids`` is held by a pod of its own
    (benchmarks.pods.assignments), the pods written beside the socket."""
    pods = socket.with_suffix(".json")
    pods.write_text(json.dumps(assignments(ids, len(ids))))
    return serve(socket, pods)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.kubelet SOCKET PODS.json", file=sys.stderr)
        return 2
    server = serve(Path(args[0]), Path(args[1]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
