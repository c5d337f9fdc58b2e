"""List-then-watch of one API resource, forever: the reflector loop.

List (remember metadata.resourceVersion), then watch from there with
``timeoutSeconds`` and a socket read timeout a little longer, so a dead
connection is noticed; when a watch ends or breaks, watch again from the last
resourceVersion seen; on 410 Gone (HTTP status or ERROR event) list again.
Failures are retried with exponential backoff capped at ``Timing.backoff_max_s``
while the last good data stays in use, and ``status`` says what is wrong.

A list answer is read up to ``limits.MAX_LIST_BYTES`` and a watch line up to
``limits.MAX_WATCH_LINE_BYTES``; past either the answer is refused (counted,
logged at most a few times a minute) and listed again after a backoff.

Requests go through apiclient.py (the standard library's http.client).
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exporter.runtime.ratelimit import RateLimitedLog
from exporter.workloads import limits
from exporter.workloads.apiserver import kubeconfig
from exporter.workloads.apiserver.apiclient import (
    ApiClient,
    ApiError,
    ConnectError,
    Response,
    Timeout,
)
from exporter.workloads.apiserver.kubeconfig import KubeConfigError
from exporter.workloads.limits import Drops

log = logging.getLogger(__name__)

Lister = Callable[[dict[str, str], Timeout], Response]
"""GET one collection with these query parameters and (connect, read) timeouts, s."""


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds. Retries wait 50-100 % of a delay that doubles from
    ``backoff_initial_s`` to ``backoff_max_s``. Watches last ``watch_timeout_s``
    to 1.5 times that (spread so that a fleet of exporters does not reconnect at
    once); reads time out ``read_grace_s`` after that."""

    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    watch_timeout_s: int = 300
    read_grace_s: float = 30.0
    connect_timeout_s: float = 10.0
    list_timeout_s: float = 60.0


class Gone(Exception):
    """The resourceVersion we hold has been compacted away: list again."""


class TooLarge(ValueError):
    """An answer from the API server past one of the bounds of limits.py."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class Reflector:
    """List and watch one resource, forever, calling back with what changed.

    ``on_list`` gets a list answer's items, ``on_event`` each ADDED, MODIFIED or
    DELETED event; an exception from either is logged (rate-limited) and the
    resource is listed again after a backoff, like a bad answer."""

    def __init__(
        self,
        what: str,
        selector: str,
        resolve: Callable[[], Lister],
        on_list: Callable[[list[Any]], None],
        on_event: Callable[[str, Any], None],
        stop: threading.Event,
        timing: Timing,
        drops: Drops | None = None,
    ) -> None:
        self.what, self.selector, self.timing = what, selector, timing
        self._resolve, self._on_list, self._on_event, self._stop = resolve, on_list, on_event, stop
        self.drops = drops if drops is not None else Drops()
        self._warn = RateLimitedLog(log)
        self._resp: Response | None = None
        self.rv: str | None = None  # where the next watch starts; None: list first
        self.synced = False
        self.status = f"{what}: waiting for the first list from the API server"
        self._list_fn: Lister | None = None
        self._delay = timing.backoff_initial_s
        self._failing = ""
        self._after_gone = False

    def run(self) -> None:
        """Loop until the stop event is set (the watch thread's target)."""
        while not self._stop.is_set():
            try:
                self._step()
            except Gone:
                self.rv = None
                if self._after_gone:  # 410 again right after a list: not worth a tight loop
                    self._backoff(self._delay)
                self._after_gone = True
            except Exception as e:
                if self._stop.is_set():
                    break
                self._failed(e)

    def _step(self) -> None:
        """One list (when needed) and one watch."""
        if self.rv is None or self._list_fn is None:
            self._list_fn = self._resolve()
            self.rv = self._list(self._list_fn, consistent=self._after_gone)
            if self._failing:
                log.info("%s: API server reachable again", self.what)
            self._failing = ""
        quick = self._watch(self._list_fn, self.rv)
        if self._failing:
            log.info("%s: watch resumed", self.what)
        self._failing, self._after_gone = "", False
        if quick:  # an empty stream that ended at once: do not spin on such a server
            self._backoff(self._delay)
        else:
            self._delay = self.timing.backoff_initial_s

    def _backoff(self, wait: float) -> None:
        self._stop.wait(wait)
        self._delay = min(self._delay * 2, self.timing.backoff_max_s)

    def _failed(self, e: Exception) -> None:
        if isinstance(e, TooLarge):
            self.drops.add(e.what)
        reason = _describe(e)
        if reason != self._failing:
            self._warn.warning("%s: %s", self.what, reason)
            self._failing = reason
        connection = _is_connection_error(e)
        if not connection:
            self.rv = None  # an answer we did not expect: start over, from discovery
        # Jitter spreads a fleet's retries after an API server restart.
        wait = self._delay * random.uniform(0.5, 1.0)
        retry = f"retrying in {wait:.2g} s"
        if connection:
            self.status = f"{self.what}: API server unreachable ({retry}): {reason}"
        else:
            self.status = f"{self.what}: {reason} ({retry})"
        self._backoff(wait)

    def abort(self) -> None:
        """Unblock a read in progress (from another thread)."""
        resp = self._resp
        if resp is not None:
            resp.abort()

    def _list(self, list_fn: Lister, consistent: bool) -> str:
        """Replace everything; the list's resourceVersion. Served from the API
        server's watch cache (resourceVersion=0): etcd has no index on spec.nodeName,
        so a quorum read per node scans every pod of the cluster. After a 410 the
        read is consistent instead, so the state cannot go back in time."""
        t = self.timing
        params = {"fieldSelector": self.selector}
        if not consistent:
            params["resourceVersion"] = "0"
        resp = list_fn(params, (t.connect_timeout_s, t.list_timeout_s))
        body = read_json(resp)
        items = body.get("items") or []
        if not isinstance(items, list):
            raise ValueError(f"list answer's items is a {type(items).__name__}, not a list")
        self._on_list(items)
        self.synced = True
        self.status = ""
        log.debug("%s: listed %d", self.what, len(items))
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, list_fn: Lister, rv: str) -> bool:
        """Stream events into ``self.rv`` until the server ends the watch; True if it
        ended at once without events. Raises Gone on 410, and what broke it."""
        t = self.timing
        timeout = int(t.watch_timeout_s * (1 + random.random() / 2))
        started = time.monotonic()
        try:
            params = {
                "fieldSelector": self.selector,
                "watch": "true",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout),
            }
            resp = list_fn(params, (t.connect_timeout_s, timeout + t.read_grace_s))
        except ApiError as e:
            if e.status == 410:
                raise Gone from e
            raise
        self._resp = resp
        if self._stop.is_set():  # stop() came before _resp was there to abort
            self.abort()
        self.status = ""
        events = 0
        try:
            for line in lines(resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(f"watch event is a {type(event).__name__}, not an object")
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone
                    raise RuntimeError(
                        f"watch error {obj.get('code')} {obj.get('reason')}: {obj.get('message')}"
                    )
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj)
                    events += 1
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    self.rv = str(new_rv)
        finally:
            self._resp = None
            resp.close()
        return events == 0 and time.monotonic() - started < min(1.0, timeout / 2)


def lines(resp: Response, max_line: int | None = None) -> Iterable[str]:
    """The non-empty lines of a streamed answer; raises TooLarge for a line longer
    than ``max_line`` bytes (default ``limits.MAX_WATCH_LINE_BYTES``)."""
    limit = limits.MAX_WATCH_LINE_BYTES if max_line is None else max_line
    buf = b""
    for chunk in resp.stream(64 * 1024):
        buf += chunk
        *done, buf = buf.split(b"\n")
        for line in done:
            if len(line) > limit:
                raise TooLarge("watch_line", f"a watch event is longer than {limit} bytes")
            if line.strip():
                yield line.decode("utf-8", errors="replace")
        if len(buf) > limit:
            raise TooLarge("watch_line", f"a watch event is longer than {limit} bytes")


def read_json(resp: Response, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON object of a whole answer, read up to ``max_bytes`` (default
    ``limits.MAX_LIST_BYTES``); raises TooLarge past it, ValueError if not an object."""
    limit = limits.MAX_LIST_BYTES if max_bytes is None else max_bytes
    try:
        data = resp.read(limit + 1)
    finally:
        resp.close()  # one connection per request (apiclient.py): the rest stays unread
    if len(data) > limit:
        raise TooLarge("list_bytes", f"the list answer is larger than {limit} bytes")
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    return body


def default_api_client(sa_dir: str = kubeconfig.SERVICE_ACCOUNT_DIR) -> ApiClient:
    """A client for the in-cluster configuration, else KUBECONFIG or ~/.kube/config
    (kubeconfig.py); raises KubeConfigError saying what is missing."""
    return ApiClient(kubeconfig.load(sa_dir))


def _is_connection_error(e: BaseException) -> bool:
    return isinstance(e, OSError | http.client.HTTPException)


def _describe(e: BaseException) -> str:
    """One short line for status and logs."""
    if isinstance(e, ApiError):
        msg = str(e)
        try:
            detail = json.loads(e.body or "{}").get("message")
        except (ValueError, AttributeError):
            detail = None
        if detail:
            msg += f": {detail}"
        if e.status in (401, 403):
            msg += (
                " (needs get, list and watch on pods, and with DRA on resourceslices"
                " and resourceclaims)"
            )
        return msg[:300]
    if isinstance(e, KubeConfigError):
        return str(e)[:600]  # both attempts, each naming its input and what to do
    if isinstance(e, TimeoutError):
        return "read timed out"
    text = str(e) or type(e).__name__
    if isinstance(e, http.client.HTTPException | OSError) and not isinstance(e, ConnectError):
        text = f"connection broken: {text}"
    return text[:300]
