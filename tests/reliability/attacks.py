"""The attacks of the attack soak (tests/reliability/attack_soak.py), one function each.

Each runs against a :class:`Target` (the exporter process and its inputs) until
``stop_at`` (time.monotonic()), keeps its sockets and threads bounded, and leaves
things as it found them: its sockets closed, the files good again, the kubelet and
the API server answering normally. Everything is on 127.0.0.1 or a unix socket.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from tests.support.fakekubelet import FakeKubelet
from tests.support.hostileapi import HostileAPIServer, pod, pod_list

HALF_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Target:
    """The exporter under attack and the inputs the attacks may change."""

    port: int
    pid: int
    client_ctx: ssl.SSLContext
    web_config: Path
    web_text: str  # the good web config
    metrics_file: Path
    metrics_text: str  # the good metrics file
    kubelet: FakeKubelet
    good_pods: pb.ListPodResourcesResponse
    api: HostileAPIServer
    pods: int  # pods p-0 .. p-(pods-1) in namespace ns, known to kubelet and API server
    big_labels: threading.Event = field(default_factory=threading.Event)
    counts: dict[str, int] = field(default_factory=dict)

    def note(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def raw(self, timeout: float = 3.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def tls(self, timeout: float = 3.0) -> ssl.SSLSocket:
        """A connection with its TLS handshake done."""
        raw = self.raw(timeout)
        try:
            return self.client_ctx.wrap_socket(raw)
        except (OSError, ssl.SSLError):
            raw.close()
            raise


def _close(socks: list[Any]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()
    socks.clear()


def _open(make: Callable[[], Any], n: int) -> list[Any]:
    out = []
    for _ in range(n):
        try:
            out.append(make())
        except (OSError, ssl.SSLError):
            break
    return out


def tls_handshake_flood(t: Target, stop_at: float) -> None:
    """300 sockets sending half a ClientHello and nothing more, renewed every 3 s."""
    while time.monotonic() < stop_at:
        socks = _open(t.raw, 300)
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(HALF_HELLO)
        t.note("tls_half_handshakes", len(socks))
        time.sleep(max(0.0, min(3.0, stop_at - time.monotonic())))
        _close(socks)


def header_flood(t: Target, stop_at: float) -> None:
    """Rounds of 40 clients with 15 KiB of headers never finished, 10 with 32 KiB (431)
    and 15 sending a header byte every 0.2 s, all over TLS."""
    big = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(4)
    )
    while time.monotonic() < stop_at:
        pending = _open(t.tls, 40)
        for s in pending:
            with contextlib.suppress(OSError):
                s.sendall(big[:15000])
        over = _open(t.tls, 10)
        for s in over:
            with contextlib.suppress(OSError):
                s.sendall(big + b"\r\n")
                t.note("http_431", s.recv(100).startswith(b"HTTP/1.1 431"))
        drip = _open(t.tls, 15)
        end = min(stop_at, time.monotonic() + 2.5)
        while time.monotonic() < end:
            for s in drip:
                with contextlib.suppress(OSError):
                    s.send(b"X")
            time.sleep(0.2)
        t.note("header_flood_clients", len(pending) + len(over) + len(drip))
        _close(pending + over + drip)


def never_reading(t: Target, stop_at: float) -> None:
    """Rounds of 30 TLS clients pipelining 200 requests each and reading nothing."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200

    def deaf() -> ssl.SSLSocket:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(3)
        raw.connect(("127.0.0.1", t.port))
        return t.client_ctx.wrap_socket(raw)

    while time.monotonic() < stop_at:
        socks = _open(deaf, 30)
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(request)
        t.note("never_reading_clients", len(socks))
        time.sleep(max(0.0, min(3.0, stop_at - time.monotonic())))
        _close(socks)


def _rewrite(path: Path, text: str) -> None:
    path.write_text(text)


def wrong_passwords(t: Target, stop_at: float) -> None:
    """A web config reload (which starts the credential cache afresh), then 4 threads
    sending wrong passwords until ``stop_at``."""
    _rewrite(t.web_config, t.web_text + "# reloaded\n")
    hup(t)
    refused = [0]

    def attacker(k: int) -> None:
        for i in itertools.count():
            if time.monotonic() >= stop_at:
                return
            try:
                with contextlib.closing(t.tls(5)) as s:
                    auth = basic("prom", f"x{k}-{i}")
                    s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                              "Connection: close\r\n\r\n".encode())  # fmt: skip
                    refused[0] += s.recv(12) in (b"HTTP/1.1 401", b"HTTP/1.1 503")
            except (OSError, ssl.SSLError):
                pass

    threads = [threading.Thread(target=attacker, args=(k,), daemon=True) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(stop_at - time.monotonic() + 10)
    t.note("wrong_passwords_refused", refused[0])
    _rewrite(t.web_config, t.web_text)
    time.sleep(1.1)
    hup(t)


def hup(t: Target, n: int = 1) -> None:
    for _ in range(n):
        with contextlib.suppress(ProcessLookupError):
            os.kill(t.pid, signal.SIGHUP)


def sighup_storm(t: Target, stop_at: float) -> None:
    """SIGHUPs in bursts of 20 every 0.25 s while the web config and the metrics file are
    rewritten: good, changed, emptied, cut before basic_auth_users, cut in the hash,
    cut in a type. Ends with the good files loaded."""
    web, metrics = t.web_text, t.metrics_text
    cut_type = metrics.index(", gauge") + 4  # "DCGM_..., ga": a type that does not exist
    variants = [
        (web + "# changed\n", metrics),
        ("", metrics),
        (web[: web.index("basic_auth_users")], metrics),
        (web[: len(web) - 20], metrics),
        (web, metrics[:cut_type]),
        (web, metrics + "# changed\n"),
    ]
    for k in itertools.count():
        if time.monotonic() >= stop_at:
            break
        w, m = variants[k % len(variants)]
        _rewrite(t.web_config, w)
        _rewrite(t.metrics_file, m)
        hup(t, 20)
        t.note("sighups", 20)
        time.sleep(0.25)
    _rewrite(t.web_config, web)
    _rewrite(t.metrics_file, metrics)
    time.sleep(1.1)  # past the coalescing second: this SIGHUP is acted on
    hup(t)


def hostile_answer(good: pb.ListPodResourcesResponse) -> pb.ListPodResourcesResponse:
    """The good answer plus a tenant pod with a 5,000-digit ID, 20,000 unknown IDs and
    1,000 resource names."""
    resp = pb.ListPodResourcesResponse()
    resp.CopyFrom(good)
    c = resp.pod_resources.add(name="hostile", namespace="tenant").containers.add(name="m")
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=["nvidia" + "9" * 5000, "GPU-zz", ""])
    for i in range(1000):
        c.devices.add(resource_name=f"nvidia.com/mig-x{i}", device_ids=["MIG-nope-0000-0000"])
    c.devices.add(
        resource_name="nvidia.com/gpu", device_ids=[f"GPU-{i:08x}" for i in range(20_000)]
    )
    return resp


def hostile_kubelet(t: Target, stop_at: float) -> None:
    """The kubelet answers: hostile (half the time), then malformed, then
    RESOURCE_EXHAUSTED, then well again."""
    left = stop_at - time.monotonic()
    t.kubelet.pods = hostile_answer(t.good_pods)
    time.sleep(max(0.0, left / 2))
    t.kubelet.pods = t.good_pods
    t.kubelet.mode = "malformed"
    time.sleep(max(0.0, left / 4))
    t.kubelet.mode = "exhausted"
    time.sleep(max(0.0, stop_at - time.monotonic()))
    t.kubelet.mode = "ok"


def oversized_labels(t: Target, stop_at: float) -> None:
    """Pod p-0 carries 5,000 labels in the watch churn, and one watch answer is a 5 MiB
    line without a newline (over the watch buffer's bound)."""
    t.big_labels.set()
    t.api.watches = lambda: iter([b"x" * 65536] * 80)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    t.api.watches = lambda: churn(t)
    t.big_labels.clear()


MANY_LABELS = {f"team.example.com/l{i:05d}": "v" * 100 for i in range(5000)}


def churn(t: Target, events: int = 100, every_s: float = 0.05) -> Iterator[bytes]:
    """One watch answer: ``events`` MODIFIED events, one every ``every_s`` seconds, each
    giving a pod a new "rev" label (and p-0 its 5,000 labels while ``big_labels``)."""
    for k in range(events):
        i = k % t.pods
        labels = {"app": "train", "rev": str(time.monotonic_ns())}
        if i == 0 and t.big_labels.is_set():
            labels.update(MANY_LABELS)
        t.note("watch_events")
        yield json.dumps({"type": "MODIFIED", "object": pod(i, labels)}).encode() + b"\n"
        time.sleep(every_s)


def start_api(t: Target) -> None:
    t.api.lists = lambda: pod_list(t.pods)
    t.api.watches = lambda: churn(t)


# A round ends with an attack whose connections are cut off, not with one that leaves a
# transient memory peak (oversized labels), so that the quiet sample after it compares.
ATTACKS: tuple[Callable[[Target, float], None], ...] = (
    oversized_labels,
    tls_handshake_flood,
    hostile_kubelet,
    header_flood,
    wrong_passwords,
    sighup_storm,
    never_reading,
)
