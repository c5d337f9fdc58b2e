"""The simulated node's kubelet: pod-resources v1 ``List`` on a unix socket of its own.

``gpu-exporter --simulate -k`` with no socket given starts one, so the exporter's real
kubelet client (exporter/workloads/kubelet/) attributes the GPUs to the fleet's ``pods:``
as they start and stop in sim time (SimDriver.pods). It speaks gRPC over HTTP/2 with prior
knowledge, as the kubelet does, on h2 and protobuf (the ``kube`` extra that ``-k`` needs
anyway), in a thread of its own with its own event loop: the exporter's loop and its NVML
worker are untouched. Only ``List`` is served; any other method answers UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from exporter.sim.driver import SimDriver

LIST = b"/v1.PodResourcesLister/List"
UNIMPLEMENTED = b"12"


def response(pods: Iterable[Mapping[str, Any]]) -> Any:
    """``pods`` (SimDriver.pods entries: name, namespace, containers with their devices and
    DRA claims) as a ``v1.ListPodResourcesResponse``."""
    from exporter.workloads.kubelet.generated import podresources_pb2 as pb

    resp = pb.ListPodResourcesResponse()
    for p in pods:
        pod = resp.pod_resources.add(name=p["name"], namespace=p["namespace"])
        for c in p["containers"]:
            cont = pod.containers.add(name=c["name"])
            for d in c.get("devices", ()):
                cont.devices.add(resource_name=d["resource_name"], device_ids=d["device_ids"])
            for claim in c.get("claims", ()):
                dr = cont.dynamic_resources.add(
                    claim_name=claim["name"], claim_namespace=claim["namespace"]
                )
                for d in claim["devices"]:
                    dr.claim_resources.add(
                        driver_name=d["driver"], pool_name=d["pool"], device_name=d["device"]
                    )
    return resp


class _Connection:
    """One client connection: an h2 server connection answering each finished request."""

    def __init__(self, driver: SimDriver, writer: asyncio.StreamWriter) -> None:
        import h2.config
        import h2.connection

        self.driver = driver
        self.writer = writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.paths: dict[int, bytes] = {}
        self.pending: dict[int, bytes] = {}  # stream -> body the flow-control window held back

    def receive(self, data: bytes) -> None:
        import h2.events

        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                self.paths[ev.stream_id] = dict(ev.headers).get(b":path", b"")
            elif isinstance(ev, h2.events.StreamEnded):
                self._answer(ev.stream_id)
            elif isinstance(ev, h2.events.WindowUpdated):
                for sid in list(self.pending):
                    self._send(sid, self.pending.pop(sid))
        self.writer.write(self.conn.data_to_send())

    def _answer(self, sid: int) -> None:
        headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        if self.paths.pop(sid, b"") != LIST:
            status = [(b"grpc-status", UNIMPLEMENTED), (b"grpc-message", b"only List is served")]
            self.conn.send_headers(sid, headers + status, end_stream=True)
            return
        body = response(self.driver.pods()).SerializeToString()
        self.conn.send_headers(sid, headers)
        self._send(sid, b"\0" + len(body).to_bytes(4, "big") + body)

    def _send(self, sid: int, body: bytes) -> None:
        """As much of ``body`` as the windows allow; the trailers once all of it is sent."""
        while body:
            window = self.conn.local_flow_control_window(sid)
            size = min(len(body), window, self.conn.max_outbound_frame_size)
            if size <= 0:
                self.pending[sid] = body
                return
            self.conn.send_data(sid, body[:size])
            body = body[size:]
        self.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)


class SimKubelet:
    """Serves the driver's pods on ``socket`` (a new temporary folder's kubelet.sock)."""

    def __init__(self, driver: SimDriver) -> None:
        self.driver = driver
        self.folder = Path(tempfile.mkdtemp(prefix="gpu-exporter-sim-kubelet-"))
        self.socket = str(self.folder / "kubelet.sock")
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-kubelet", daemon=True)

    def start(self) -> SimKubelet:
        """Listen (the socket exists when this returns)."""
        self._thread.start()
        self._ready.wait(10)
        return self

    def close(self) -> None:
        """Stop serving and remove the socket's folder."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_unix_server(self._serve, self.socket))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self.driver, writer)
        conn.conn.initiate_connection()
        writer.write(conn.conn.data_to_send())
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                conn.receive(data)
                await writer.drain()
        writer.close()
