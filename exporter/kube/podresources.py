"""Client of the kubelet pod-resources API v1 over its unix socket (grpc.aio).

One channel, reused across calls; every call has a deadline. Failures become
:class:`KubeletUnavailable` with a reason a person can act on; the mapper
decides when to retry. grpc is imported here only, so an exporter without
``--kubernetes`` never loads it.
"""

from __future__ import annotations

import logging
import os

import grpc

from exporter.config import DEFAULT_SOCKET
from exporter.kube.generated import podresources_pb2 as pb
from exporter.kube.generated import podresources_pb2_grpc as pb_grpc
from exporter.kube.limits import MAX_MESSAGE_BYTES

MAX_MESSAGE = MAX_MESSAGE_BYTES

# grpc logs an answer it cannot decode at ERROR with a traceback, once per List: a broken
# kubelet would put a traceback in the log every cycle. The mapper reports the failure
# itself, rate-limited ("kubelet List answer is not a valid List response").
logging.getLogger("grpc._common").setLevel(logging.CRITICAL)


class KubeletUnavailable(Exception):
    """The kubelet could not answer; ``throttled`` when it said RESOURCE_EXHAUSTED."""

    def __init__(self, reason: str, *, throttled: bool = False, missing: bool = False) -> None:
        super().__init__(reason)
        self.throttled = throttled
        self.missing = missing


class PodResourcesClient:
    """``List`` against one kubelet socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path}",
                options=[
                    # grpc >= 1.57 would send the socket path as :authority; the kubelet,
                    # like Kubernetes' own clients, expects localhost
                    ("grpc.default_authority", "localhost"),
                    ("grpc.max_receive_message_length", MAX_MESSAGE),
                ],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    async def list(self) -> pb.ListPodResourcesResponse:
        """Every pod's resources on this node; raises KubeletUnavailable."""
        if not os.path.exists(self.socket_path):
            await self.close()
            raise KubeletUnavailable(
                f"kubelet socket {self.socket_path} does not exist; mount the pod-resources "
                "directory or set --pod-resources-kubelet-socket",
                missing=True,
            )
        stub = self._connect()
        try:
            resp = await stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise await self._unavailable(e) from None
        if resp is None:  # grpc.aio hands back None when the answer does not parse
            raise KubeletUnavailable("kubelet List answer is not a valid List response")
        return resp

    async def _unavailable(self, e: grpc.aio.AioRpcError) -> KubeletUnavailable:
        code = e.code()
        details = str(e.details() or "")[:200]
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            return KubeletUnavailable(
                f"kubelet List answer is larger than {MAX_MESSAGE} bytes; ignoring it"
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return KubeletUnavailable(
                "kubelet rate-limited List (RESOURCE_EXHAUSTED)", throttled=True
            )
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            await self.close()  # a restarted kubelet: dial again next time
        return KubeletUnavailable(f"kubelet List failed: {code.name}: {details}")
