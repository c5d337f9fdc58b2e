"""A hostile kube-apiserver for tests: answers pod lists and watches from generators.

Unlike fakeapi.py it keeps no objects: each answer is produced while it is sent
(chunked), so a test can send 100,000 pods or 50 MB without a newline while
the test process itself stays small. Serves on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Chunks = Callable[[], Iterator[bytes]]


def pod(i: int, labels: dict[str, str] | None = None, mirror: str = "") -> dict[str, Any]:
    """A small pod object on node-a, number ``i``."""
    meta: dict[str, Any] = {
        "name": f"p-{i}",
        "namespace": "ns",
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "resourceVersion": str(2000 + i),
        "labels": labels or {},
    }
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": mirror, "churn": "x" * 2000}
    return {"metadata": meta, "spec": {"nodeName": "node-a"}, "status": {}}


def pod_list(n: int, first: int = 0) -> Iterator[bytes]:
    """A PodList of ``n`` small pods, produced as it is sent."""
    yield b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1000"},"items":['
    for start in range(first, first + n, 500):
        batch = range(start, min(start + 500, first + n))
        text = ",".join(json.dumps(pod(i)) for i in batch).encode()
        yield (b"," if start > first else b"") + text
    yield b"]}"


def events(objects: Iterator[dict[str, Any]], kind: str = "ADDED") -> Iterator[bytes]:
    """Watch event lines for ``objects``."""
    for obj in objects:
        yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class HostileAPIServer:
    """Serves ``GET /api/v1/pods``: ``lists()`` for a list, ``watches()`` for a watch
    (an empty watch by default, ended at once). Counts the requests of each kind."""

    def __init__(self) -> None:
        self.lists: Chunks = lambda: pod_list(1)
        self.watches: Chunks = lambda: iter(())
        self.requests = {"list": 0, "watch": 0}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileAPIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def count(self, kind: str) -> int:
        with self._lock:
            return self.requests[kind]

    def answer(self, watch: bool) -> Iterator[bytes]:
        with self._lock:
            self.requests["watch" if watch else "list"] += 1
        return self.watches() if watch else self.lists()


def _handler(server: HostileAPIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/api/v1/pods":
                self.send_error(404)
                return
            watch = parse_qs(url.query).get("watch", [""])[0] in ("1", "true")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in server.answer(watch):
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client gave up on this answer, as it should
                self.close_connection = True

    return Handler
