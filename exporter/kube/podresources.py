"""Client of the kubelet pod-resources API v1 over its unix socket (grpc.aio).

One channel, reused across calls; every call has a deadline. ``List`` hands
back the answer's bytes as they came, so that the mapper can tell an unchanged
answer from its bytes and parse only a new one (:func:`parse`, with wire.py: the
generated protobuf classes are for the tests' fake kubelet, not loaded here). Failures
become :class:`KubeletUnavailable` with a reason a person can act on; the
mapper decides when to retry. grpc is imported here only, so an exporter
without ``--kubernetes`` never loads it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from pathlib import Path

LEGACY_CLIENT = "-event_engine_client"
"""grpc's client on its older I/O manager: on the kubelet's unix socket at one ``List`` a
second, it costs about half the CPU of the EventEngine client, whose thread pool wakes up
around every call (docs/benchmarks.md, "Issue 16, fourth pass")."""


def _grpc_version() -> tuple[int, int]:
    """(major, minor) of the installed grpcio, read without importing it; (0, 0) if unknown."""
    spec = importlib.util.find_spec("grpc")
    if spec is None or spec.origin is None:
        return (0, 0)
    try:
        text = (Path(spec.origin).parent / "_grpcio_metadata.py").read_text()
    except OSError:
        return (0, 0)
    m = re.search(r"(\d+)\.(\d+)\.", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# Only where measured (a grpc that no longer knows the experiment logs an error line), only
# before grpc is first imported, and never over the user's own GRPC_EXPERIMENTS.
if (1, 85) <= _grpc_version() < (1, 86):
    os.environ.setdefault("GRPC_EXPERIMENTS", LEGACY_CLIENT)

import grpc  # noqa: E402

from exporter.config import DEFAULT_SOCKET  # noqa: E402
from exporter.kube.limits import MAX_MESSAGE_BYTES  # noqa: E402
from exporter.kube.wire import ListPodResourcesResponse, WireError, decode  # noqa: E402

MAX_MESSAGE = MAX_MESSAGE_BYTES
LIST = "/v1.PodResourcesLister/List"
EMPTY_REQUEST = b""  # ListPodResourcesRequest has no fields: its encoding is empty
INVALID = "kubelet List answer is not a valid List response"

# grpc logs an answer it cannot decode at ERROR with a traceback, once per call: a broken
# kubelet would put one in the log every cycle. This client decodes the answers itself
# (parse), and the mapper reports a bad one, rate-limited; the line stays off all the same.
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
        self._list: grpc.aio.UnaryUnaryMultiCallable | None = None

    def _connect(self) -> grpc.aio.UnaryUnaryMultiCallable:
        if self._list is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path}",
                options=[
                    # grpc >= 1.57 would send the socket path as :authority; the kubelet,
                    # like Kubernetes' own clients, expects localhost
                    ("grpc.default_authority", "localhost"),
                    ("grpc.max_receive_message_length", MAX_MESSAGE),
                    # Two per-call costs a small answer on a local socket gains nothing from
                    # (each about a fifth of grpc's CPU per List here): bandwidth probes (PINGs
                    # after the data, to size flow-control windows for fast links), and
                    # retry bookkeeping (a failed List is asked again next cycle anyway).
                    ("grpc.http2.bdp_probe", 0),
                    ("grpc.enable_retries", 0),
                ],
            )
            # no (de)serializers: bytes out, the answer's bytes back
            self._list = self._channel.unary_unary(LIST)
        return self._list

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._list = None

    async def list(self) -> ListPodResourcesResponse:
        """Every pod's resources on this node; raises KubeletUnavailable."""
        return parse(await self.list_bytes())

    async def list_bytes(self) -> bytes:
        """The kubelet's ``List`` answer, encoded as it came (at most ``MAX_MESSAGE``
        bytes); raises KubeletUnavailable."""
        if not os.path.exists(self.socket_path):
            await self.close()
            raise KubeletUnavailable(
                f"kubelet socket {self.socket_path} does not exist; mount the pod-resources "
                "directory or set --pod-resources-kubelet-socket",
                missing=True,
            )
        call = self._connect()
        try:
            raw = await call(EMPTY_REQUEST, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise await self._unavailable(e) from None
        if not isinstance(raw, bytes):  # no answer message at all
            raise KubeletUnavailable(INVALID)
        return raw

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


def parse(raw: bytes) -> ListPodResourcesResponse:
    """A ``List`` answer's bytes as the message; raises KubeletUnavailable when they
    do not decode."""
    try:
        return decode(raw)
    except WireError:
        raise KubeletUnavailable(INVALID) from None
