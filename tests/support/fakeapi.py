"""A fake kube-apiserver speaking the real wire format, for tests.

Serves, on 127.0.0.1, from fixture objects:

- ``GET /api/v1/pods`` and ``GET /apis/resource.k8s.io/<version>/resourceslices`` (and
  ``.../resourceclaims``, every namespace's):
  lists (``{"kind": "PodList", "metadata": {"resourceVersion": ...}, "items": [...]}``)
  and, with ``?watch=1``, watches: a chunked, newline-delimited JSON stream of
  ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}`` from
  ``resourceVersion``, ended cleanly after ``timeoutSeconds``;
- ``GET /apis/resource.k8s.io``: the APIGroup discovery document.

``fieldSelector`` is applied (unsupported fields get 400, as from the real
server); a watch from a resourceVersion older than the last ``compact()`` gets
410 Gone, as an HTTP status or as an ERROR event (``gone_as``). ResourceSlices
are converted between the v1beta1 shape (``devices[].basic``) and the
v1beta2/v1 shape on the way out, as the real server does.

Controls for tests: add/modify/delete objects (each gets the next
resourceVersion and an event), ``break_watches`` (close open watch connections
mid-stream, without the final chunk), ``freeze``/``thaw`` (hold events back from
open watches), ``stall_watches`` (send nothing, ever), ``bookmark``, and a
server that is created (its port reserved) but started later.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

FIXTURES = Path(__file__).parents[1] / "fixtures" / "apiserver"
GROUP = "resource.k8s.io"
SELECTABLE = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"},
    "resourceslices": {"metadata.name", "spec.nodeName", "spec.driver"},
    "resourceclaims": {"metadata.name", "metadata.namespace"},
}
KINDS = {"ResourceSlice": "resourceslices", "ResourceClaim": "resourceclaims"}


def load(name: str) -> list[dict[str, Any]]:
    """The objects in a fixture file of tests/fixtures/apiserver/."""
    with open(FIXTURES / name) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def free_port() -> int:
    """A free port below the ephemeral range: the client's own outgoing sockets
    take ephemeral ports, and one of them could hold the port of a server that
    is not listening yet (a test starts it later)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class FakeAPIServer:
    def __init__(
        self,
        pods: list[dict[str, Any]] | None = None,
        slices: list[dict[str, Any]] | None = None,
        *,
        claims: list[dict[str, Any]] | None = None,
        slice_versions: tuple[str, ...] = ("v1",),
        gone_as: str = "status",
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.slice_versions = slice_versions
        self.gone_as = gone_as
        self.requests: list[tuple[str, dict[str, str]]] = []  # GETs: path, query
        self.calls: list[tuple[str, str, dict[str, str]]] = []  # every request, with its method
        self._cond = threading.Condition()
        self._rv = 1000
        self._compacted = 0
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "pods": {},
            "resourceslices": {},
            "resourceclaims": {},
        }
        self._events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {
            "pods": [],
            "resourceslices": [],
            "resourceclaims": [],
        }
        self._break_gen = 0
        self._bookmark_gen = 0
        self.frozen = False
        self.stall = False
        self.deny = False  # answer 403 Forbidden, as without RBAC
        self._conns: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        for obj in pods or ():
            self._put("pods", obj, event=False)
        for obj in slices or ():
            self._put("resourceslices", obj, event=False)
        for obj in claims or ():
            self._put("resourceclaims", obj, event=False)

    # -- lifecycle --

    def start(self) -> FakeAPIServer:
        """Listen and serve (again, after stop()); no-op while serving."""
        if self._httpd is not None:
            return self
        handler = type("Handler", (_Handler,), {"fake": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler, bind_and_activate=False)
        httpd.daemon_threads = True
        httpd.allow_reuse_address = True
        httpd.server_bind()
        httpd.server_activate()
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every connection, idle keep-alive ones included."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.break_watches()
        with self._cond:
            conns = list(self._conns)
        for c in conns:
            _shutdown(c)

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- controls --

    def add(self, obj: dict[str, Any]) -> int:
        return self._put(_resource(obj), obj, kind="ADDED")

    def modify(self, obj: dict[str, Any]) -> int:
        return self._put(_resource(obj), obj, kind="MODIFIED")

    def delete(self, obj: dict[str, Any]) -> int:
        resource = _resource(obj)
        with self._cond:
            old = self._objects[resource].pop(_key(obj))
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._events[resource].append((self._rv, "DELETED", gone))
            self._cond.notify_all()
            return self._rv

    def compact(self) -> None:
        """Forget history: a watch from before now gets 410 Gone."""
        with self._cond:
            self._compacted = self._rv

    def break_watches(self) -> None:
        with self._cond:
            self._break_gen += 1
            self._cond.notify_all()

    def freeze(self) -> None:
        with self._cond:
            self.frozen = True

    def thaw(self) -> None:
        with self._cond:
            self.frozen = False
            self._cond.notify_all()

    def bookmark(self) -> None:
        with self._cond:
            self._rv += 1
            self._bookmark_gen += 1
            self._cond.notify_all()

    def count(self, path: str, watch: bool) -> int:
        """Requests so far to ``path``, watches or lists."""
        return sum(
            1 for p, q in list(self.requests) if p == path and (q.get("watch") == "true") == watch
        )

    # -- internals --

    def _put(
        self, resource: str, obj: dict[str, Any], *, event: bool = True, kind: str = "ADDED"
    ) -> int:
        with self._cond:
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            self._objects[resource][_key(obj)] = obj
            if event:
                self._events[resource].append((self._rv, kind, obj))
                self._cond.notify_all()
            return self._rv


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeAPIServer

    def setup(self) -> None:
        super().setup()
        with self.fake._cond:
            self.fake._conns.add(self.connection)

    def finish(self) -> None:
        with self.fake._cond:
            self.fake._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> tuple[str, dict[str, str]]:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.fake.calls.append((self.command, url.path, query))
        return url.path, query

    def _not_served(self) -> None:
        """Any method but GET: recorded, and refused as a read-only fake."""
        self._record()
        self._status(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowed", "read-only fake")

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _not_served

    def do_GET(self) -> None:
        path, query = self._record()
        url = urlsplit(self.path)
        self.fake.requests.append((path, query))
        if self.fake.deny:
            message = 'pods is forbidden: User "system:serviceaccount:gpu:exporter" cannot list'
            self._status(HTTPStatus.FORBIDDEN, "Forbidden", message)
            return
        parts = url.path.strip("/").split("/")
        if parts == ["api", "v1", "pods"]:
            self._collection("pods", "v1", "Pod", query)
        elif parts == ["apis", GROUP]:
            self._discovery()
        elif parts[:2] == ["apis", GROUP] and parts[3:] in (["resourceslices"], ["resourceclaims"]):
            if parts[2] not in self.fake.slice_versions:
                self._status(HTTPStatus.NOT_FOUND, "NotFound", "the server could not find it")
            else:
                kind = "ResourceSlice" if parts[3] == "resourceslices" else "ResourceClaim"
                self._collection(parts[3], f"{GROUP}/{parts[2]}", kind, query)
        else:
            self._status(HTTPStatus.NOT_FOUND, "NotFound", "the server could not find it")

    # -- responses --

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: HTTPStatus, reason: str, message: str) -> None:
        self._json(code, _status_object(code, reason, message))

    def _discovery(self) -> None:
        served = self.fake.slice_versions
        versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in served]
        if not versions:
            self._status(HTTPStatus.NOT_FOUND, "NotFound", "the server could not find it")
            return
        body = {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": versions}
        body["preferredVersion"] = versions[0]
        self._json(200, body)

    def _collection(self, resource: str, api_version: str, kind: str, q: dict[str, str]) -> None:
        try:
            selector = _parse_selector(q.get("fieldSelector", ""), SELECTABLE[resource])
        except ValueError as e:
            self._status(HTTPStatus.BAD_REQUEST, "BadRequest", str(e))
            return
        if q.get("watch") in ("true", "1", "True"):
            self._watch(resource, api_version, kind, selector, q)
            return
        fake = self.fake
        with fake._cond:
            items = [o for o in fake._objects[resource].values() if _matches(o, selector)]
            rv = fake._rv
        items = [_serve(o, api_version, in_list=True) for o in items]
        meta = {"resourceVersion": str(rv)}
        self._json(200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta,
                         "items": items})  # fmt: skip

    def _watch(
        self,
        resource: str,
        api_version: str,
        kind: str,
        selector: list[tuple[str, bool, str]],
        q: dict[str, str],
    ) -> None:
        fake = self.fake
        rv = q.get("resourceVersion")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1", "True")
        deadline = time.monotonic() + float(q.get("timeoutSeconds", 1800))
        with fake._cond:
            gone = rv not in (None, "", "0") and int(rv) < fake._compacted
            start_break, start_bookmark = fake._break_gen, fake._bookmark_gen
            history = fake._events[resource]
            if rv in (None, "", "0"):
                pending = [("ADDED", o) for o in fake._objects[resource].values()]
                cursor = len(history)
            else:
                pending = []
                cursor = next((i for i, e in enumerate(history) if e[0] > int(rv)), len(history))
        too_old = f"too old resource version: {rv} ({fake._compacted})"
        if gone and fake.gone_as == "status":
            self._status(HTTPStatus.GONE, "Expired", too_old)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if gone:
            error = _status_object(HTTPStatus.GONE, "Expired", too_old)
            self._chunk({"type": "ERROR", "object": error})
            self._end()
            return
        while True:
            events = [(t, o) for t, o in pending if _matches(o, selector)]
            pending = []
            for t, o in events:
                self._chunk({"type": t, "object": _serve(o, api_version)})
            with fake._cond:
                while True:
                    if fake._break_gen != start_break:
                        _shutdown(self.connection)
                        self.close_connection = True
                        return
                    if fake.stall:
                        fake._cond.wait(0.05)
                        continue
                    if time.monotonic() >= deadline:
                        break
                    if bookmarks and fake._bookmark_gen != start_bookmark:
                        start_bookmark = fake._bookmark_gen
                        mark = {"kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(fake._rv)}}  # fmt: skip
                        pending.append(("BOOKMARK", mark))
                        break
                    if not fake.frozen and cursor < len(history):
                        pending = [(t, o) for _, t, o in history[cursor:]]
                        cursor = len(history)
                        break
                    fake._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            if not pending:
                self._end()
                return

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": int(code)}  # fmt: skip


def _resource(obj: dict[str, Any]) -> str:
    return KINDS.get(obj.get("kind", ""), "pods")


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _parse_selector(text: str, allowed: set[str]) -> list[tuple[str, bool, str]]:
    out = []
    for term in filter(None, text.split(",")):
        if "!=" in term:
            field, value = term.split("!=", 1)
            equal = False
        else:
            field, _, value = term.replace("==", "=").partition("=")
            equal = True
        if field not in allowed:
            raise ValueError(f'field label not supported: "{field}"')
        out.append((field, equal, value))
    return out


def _matches(obj: dict[str, Any], selector: list[tuple[str, bool, str]]) -> bool:
    for field, equal, value in selector:
        v: Any = obj
        for part in field.split("."):
            v = v.get(part, "") if isinstance(v, dict) else ""
        if (str(v) == value) != equal:
            return False
    return True


def _serve(obj: dict[str, Any], api_version: str, in_list: bool = False) -> dict[str, Any]:
    """The object as ``api_version`` shows it; list items carry no kind/apiVersion."""
    obj = copy.deepcopy(obj)
    if obj.get("kind") == "ResourceSlice":
        beta1 = api_version.endswith("/v1beta1")
        for dev in obj.get("spec", {}).get("devices", []):
            if beta1 and "basic" not in dev:
                dev["basic"] = {k: dev.pop(k) for k in ("attributes", "capacity") if k in dev}
                for k in ("taints", "allowMultipleAllocations"):  # not in v1beta1
                    dev.pop(k, None)
            elif not beta1 and "basic" in dev:
                dev.update(dev.pop("basic"))
        obj["apiVersion"] = api_version
    elif obj.get("kind") == "ResourceClaim":
        obj["apiVersion"] = api_version
    if in_list:
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
    return obj


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
