"""Client of the kubelet pod-resources API v1 over its unix socket.

One connection (exporter/workloads/kubelet/grpcclient.py: gRPC over HTTP/2 with h2; no grpcio),
reused across calls; every call has a deadline. ``List`` hands back the answer's
bytes as they came, so that the mapper can tell an unchanged answer from its bytes
and decode only a new one (:func:`parse`: exporter/workloads/kubelet/listanswer.py bounds it,
protobuf's generated classes decode it). Failures become
:class:`KubeletUnavailable` with a reason a person can act on; the mapper decides
when to retry. h2 and protobuf are imported here only, so an exporter without
``--kubernetes`` never loads them.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from exporter.config.model import DEFAULT_SOCKET
from exporter.workloads.kubelet import grpcclient
from exporter.workloads.kubelet.grpcclient import AnswerInvalid, AnswerTooLarge, CallError
from exporter.workloads.kubelet.listanswer import InvalidAnswer, decode
from exporter.workloads.limits import MAX_MESSAGE_BYTES

MAX_MESSAGE = MAX_MESSAGE_BYTES
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
EMPTY_REQUEST = b""  # ListPodResourcesRequest has no fields: its encoding is empty
INVALID = "kubelet List answer is not a valid List response"
MAX_DETAILS_CHARS = 200
"""Longest part of the kubelet's own error message (grpc-message) put in a reason."""


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
        self._channel: grpcclient.Channel | None = None

    def _connect(self) -> grpcclient.Channel:
        if self._channel is None:
            self._channel = grpcclient.Channel(self.socket_path, max_message=MAX_MESSAGE)
        return self._channel

    async def close(self) -> None:
        """Close the connection; the next call dials again."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def list(self) -> Any:
        """Every pod's resources on this node (a ``v1.ListPodResourcesResponse``, within the
        bounds of limits.py); raises KubeletUnavailable."""
        return parse(await self.list_bytes())[0]

    async def list_bytes(self) -> bytes:
        """The kubelet's ``List`` answer, encoded as it came (at most ``MAX_MESSAGE``
        bytes); raises KubeletUnavailable."""
        return await self._call(LIST, "List")

    async def allocatable_bytes(self) -> bytes:
        """The kubelet's ``GetAllocatableResources`` answer (every device the device plugins
        advertise, held or not), encoded as it came; raises KubeletUnavailable (a kubelet
        older than 1.23, or without the feature gate, answers UNIMPLEMENTED)."""
        return await self._call(ALLOCATABLE, "GetAllocatableResources")

    async def _call(self, method: str, name: str) -> bytes:
        if not os.path.exists(self.socket_path):
            await self.close()
            raise KubeletUnavailable(
                f"kubelet socket {self.socket_path} does not exist; mount the pod-resources "
                "directory or set --pod-resources-kubelet-socket",
                missing=True,
            )
        channel = self._connect()
        try:
            return await channel.call(method, EMPTY_REQUEST, self.timeout_s)
        except AnswerTooLarge:
            raise KubeletUnavailable(
                f"kubelet {name} answer is larger than {channel.max_message} bytes; ignoring it"
            ) from None
        except AnswerInvalid as e:
            what = INVALID if method == LIST else f"kubelet {name} answer is not valid"
            raise KubeletUnavailable(f"{what} ({e})") from None
        except CallError as e:
            raise await self._unavailable(e, name) from None

    async def _unavailable(self, e: CallError, name: str = "List") -> KubeletUnavailable:
        details = "".join(c if c.isprintable() else " " for c in e.details[:MAX_DETAILS_CHARS])
        if e.code == "RESOURCE_EXHAUSTED":
            return KubeletUnavailable(
                f"kubelet rate-limited {name} (RESOURCE_EXHAUSTED)", throttled=True
            )
        if e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            await self.close()  # a restarted kubelet: dial again next time
        return KubeletUnavailable(f"kubelet {name} failed: {e.code}: {details}")


def parse(raw: bytes) -> tuple[Any, Counter[str]]:
    """A ``List`` answer's bytes as the message, within the bounds of limits.py, and the
    counts of what was dropped by input; raises KubeletUnavailable when they do not
    decode."""
    try:
        return decode(raw)
    except InvalidAnswer as e:
        raise KubeletUnavailable(f"{INVALID} ({e})") from None
