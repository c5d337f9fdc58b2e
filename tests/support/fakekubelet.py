"""A fake kubelet: a real grpc.aio pod-resources server on a unix socket, fed by fixture files.

Fixture files (tests/fixtures/kubelet/*.yaml) list pods with their containers'
devices and DRA claims. Device IDs may use placeholders resolved against the
simulated fleet: ``{gpu:N}`` is GPU N's UUID, ``{mig:N:GI}`` the UUID of the
MIG instance with GPU instance id GI on GPU N.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from exporter import sim
from exporter.workloads.kubelet.generated import podresources_pb2 as pb

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kubelet"


def fleet_ids(fleet: str | Path | None) -> dict[str, str]:
    """Placeholder -> UUID for every GPU and MIG instance of a fleet."""
    driver = sim.install(fleet)
    try:
        out = {}
        for g in driver.gpus:
            out[f"gpu:{g.index}"] = g.uuid
            for m in g.migs:
                out[f"mig:{g.index}:{m.gi}"] = m.uuid
        return out
    finally:
        sim.uninstall()


def load_pods(name: str | Path, ids: dict[str, str]) -> pb.ListPodResourcesResponse:
    """A fixture file (a name in tests/fixtures/kubelet/, or a path) as a List answer."""
    raw = yaml.safe_load((FIXTURES / name).read_text())

    def sub(s: str) -> str:
        return re.sub(r"\{([a-z]+:[0-9:]+)\}", lambda m: ids[m.group(1)], s)

    resp = pb.ListPodResourcesResponse()
    for p in raw.get("pods", []):
        pod = resp.pod_resources.add(name=p["name"], namespace=p["namespace"])
        for c in p.get("containers", []):
            cont = pod.containers.add(name=c["name"])
            for d in c.get("devices", []):
                cont.devices.add(resource_name=d["resource"], device_ids=[sub(i) for i in d["ids"]])
            for claim in c.get("claims", []):
                dr = cont.dynamic_resources.add(
                    claim_name=claim["name"], claim_namespace=claim["namespace"]
                )
                for r in claim["resources"]:
                    dr.claim_resources.add(
                        driver_name=r["driver"], pool_name=r["pool"], device_name=r["device"]
                    )
    return resp


class FakeKubelet:
    """Serves List/Get/GetAllocatableResources; its behaviour can be changed while it runs.

    ``mode``: "ok", "slow" (answers after ``delay`` s), "exhausted" (RESOURCE_EXHAUSTED),
    "malformed" (bytes that are not a ListPodResourcesResponse); "unimplemented" answers
    GetAllocatableResources UNIMPLEMENTED (a kubelet before 1.23). ``raw``: when not empty,
    List answers these bytes as they are, each in turn (answers no encoder would make).
    """

    def __init__(self, socket_path: Path, pods: pb.ListPodResourcesResponse) -> None:
        self.socket_path = Path(socket_path)
        self.pods = pods
        self.mode = "ok"
        self.delay = 0.0
        self.calls = 0
        self.raw: list[bytes] = []
        # GetAllocatableResources' answer; None: the devices the pods hold
        self.allocatable: pb.AllocatableResourcesResponse | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: Any = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def start(self) -> FakeKubelet:
        self._run(self._start())
        return self

    async def _start(self) -> None:
        server = grpc.aio.server()
        handlers = {
            "List": (pb.ListPodResourcesRequest, self._list),
            "Get": (pb.GetPodResourcesRequest, self._get),
            "GetAllocatableResources": (pb.AllocatableResourcesRequest, self._allocatable),
        }
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "v1.PodResourcesLister",
                    {
                        name: grpc.unary_unary_rpc_method_handler(
                            fn, request_deserializer=req.FromString, response_serializer=self._bytes
                        )
                        for name, (req, fn) in handlers.items()
                    },
                )
            ]
        )
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    def _bytes(self, resp: Any) -> bytes:
        if self.mode == "malformed":
            return b"\x0a\x05\x0a"  # a length prefix promising more bytes than follow
        if self.raw and isinstance(resp, pb.ListPodResourcesResponse):
            return self.raw[self.calls % len(self.raw)]
        return resp.SerializeToString()

    async def _list(self, request: Any, context: Any) -> Any:
        return await self._answer(context, self.pods)

    async def _get(self, request: Any, context: Any) -> Any:
        for p in self.pods.pod_resources:
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return await self._answer(context, pb.GetPodResourcesResponse(pod_resources=p))
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")

    async def _allocatable(self, request: Any, context: Any) -> Any:
        if self.mode == "unimplemented":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        if self.allocatable is not None:
            return await self._answer(context, self.allocatable)
        resp = pb.AllocatableResourcesResponse()
        for p in self.pods.pod_resources:
            for c in p.containers:
                resp.devices.extend(c.devices)
        return await self._answer(context, resp)

    async def _answer(self, context: Any, resp: Any) -> Any:
        self.calls += 1
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if self.mode == "exhausted":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit")
        return resp

    async def stop_gracefully(self, grace_s: float) -> float:
        """grpcio's graceful stop (GOAWAY, calls in flight finish, at most ``grace_s``),
        awaited without blocking the caller's event loop; the seconds it took."""

        async def stop() -> float:
            started = time.monotonic()
            await self._server.stop(grace_s)
            return time.monotonic() - started

        took = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stop(), self._loop))
        self._server = None
        return took

    def stop(self, remove_socket: bool = True) -> None:
        if self._server is not None:
            self._run(self._server.stop(0))
            self._server = None
        if remove_socket and self.socket_path.exists():
            os.unlink(self.socket_path)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
