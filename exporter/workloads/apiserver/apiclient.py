"""A small HTTP client for the Kubernetes API server: GET, JSON lists, watch streams.

Just what the pod watch needs (list, watch, group discovery), on the standard
library: one connection per request (http.client, TLS through ssl), so a
watch's socket is its own and another thread can cut it (``Response.abort``).
Importing the kubernetes Python client instead would cost about 30 MiB of RSS.

Authentication: a bearer token (from the configuration, or from a token file
re-read every ``token_refresh_s``: bound service-account tokens rotate), a
client certificate, or basic auth (kubeconfig.py reads the configuration).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlencode, urlsplit

from exporter.workloads.apiserver.kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    masked,
    read_pem,
    read_token,
)

MAX_ERROR_BODY_BYTES = 64 * 1024
"""An error answer's body is read up to this many bytes (it only feeds a message)."""

Timeout = tuple[float, float]  # (connect, read) seconds


class ApiError(Exception):
    """The API server answered with a status other than 200; ``body`` is the start
    of its answer (a Status object as JSON, usually)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body


class ConnectError(ConnectionError):
    """The API server could not be reached (connection refused or timed out, DNS,
    TLS handshake); the message names the server."""


class Response:
    """A 200 answer being read. ``abort`` (from any thread) unblocks a read in
    progress, which then fails with an OSError or http.client error."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp, self._sock = conn, resp, conn.sock
        self.status = resp.status

    def read(self, amt: int) -> bytes:
        """Up to ``amt`` bytes of the body (fewer only at its end)."""
        return self._resp.read(amt)

    def stream(self, amt: int = 64 * 1024) -> Iterator[bytes]:
        """The body in pieces of at most ``amt`` bytes, as they arrive."""
        while chunk := self._resp.read1(amt):
            yield chunk

    def abort(self) -> None:
        """Cut the connection under a blocked read (thread-safe)."""
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Release the connection (the rest of the body is not read)."""
        self._resp.close()
        self._conn.close()


class _Connection(http.client.HTTPConnection):
    """HTTP or, with a context, HTTPS with a server name of our choosing
    (tls-server-name) and the handshake under the connect timeout."""

    def __init__(
        self, host: str, port: int, timeout: float, ctx: ssl.SSLContext | None, name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ctx, self._name = ctx, name

    def connect(self) -> None:
        super().connect()
        if self._ctx is not None:
            self.sock = self._ctx.wrap_socket(self.sock, server_hostname=self._name)


class ApiClient:
    """Requests to the API server described by ``config`` (thread-safe)."""

    def __init__(
        self,
        config: ClusterConfig,
        token_refresh_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises KubeConfigError for a server URL or TLS files that cannot be used."""
        self.config = config
        self._server = masked(config.server)  # as errors name it
        url = urlsplit(config.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            where = config.source or "configuration"
            raise KubeConfigError(f"{where}: bad server {self._server!r}; give an https:// URL")
        self._host = url.hostname
        try:
            self._port = url.port or (443 if url.scheme == "https" else 80)
        except ValueError:
            raise KubeConfigError(f"{config.source}: bad port in {self._server!r}") from None
        self._prefix = url.path.rstrip("/")
        self._ctx = _tls_context(config) if url.scheme == "https" else None
        self._name = config.tls_server_name or self._host
        self._refresh_s, self._clock = token_refresh_s, clock
        self._token_lock = threading.Lock()
        self._token, self._token_at = "", 0.0

    def get(
        self, path: str, params: dict[str, str] | None = None, timeout: Timeout = (10.0, 60.0)
    ) -> Response:
        """GET ``path`` (e.g. ``/api/v1/pods``) with query ``params``. Raises ApiError
        for a status other than 200 (its body read up to MAX_ERROR_BODY_BYTES),
        ConnectError when the server cannot be reached, OSError or
        http.client.HTTPException when the connection breaks."""
        target = self._prefix + path + ("?" + urlencode(params) if params else "")
        headers = {"Accept": "application/json", "User-Agent": "gpu-exporter"}
        auth = self._authorization()
        if auth:
            headers["Authorization"] = auth
        conn = _Connection(self._host, self._port, timeout[0], self._ctx, self._name)
        try:
            self._connect(conn)
            conn.sock.settimeout(timeout[1])
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status == 200:
            return Response(conn, resp)
        try:
            body = resp.read(MAX_ERROR_BODY_BYTES).decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException):
            body = ""
        finally:
            conn.close()
        # a server may echo what it was sent: the credentials never reach a log line
        raise ApiError(resp.status, self._redact(resp.reason), self._redact(body))

    def close(self) -> None:
        """Nothing is held between requests; here for the lifecycle's symmetry."""

    def _redact(self, text: str) -> str:
        """``text`` with every credential this client sends replaced by ``<redacted>``."""
        c = self.config
        auth = self._authorization() if c.username else ""
        for secret in (c.token, self._token, c.password, auth.partition(" ")[2]):
            if len(secret) >= 4:  # shorter ones would mask ordinary words
                text = text.replace(secret, "<redacted>")
        return text

    def _connect(self, conn: _Connection) -> None:
        where = self._server
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as e:
            raise ConnectError(
                f"cannot connect to {where}: TLS certificate not trusted "
                f"({e.verify_message or e.reason}); check the certificate authority in "
                f"{self.config.source or 'the configuration'}"
            ) from None
        except TimeoutError:
            raise ConnectError(f"cannot connect to {where}: connect timed out") from None
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
            raise ConnectError(f"cannot connect to {where}: {reason}") from None

    def _authorization(self) -> str:
        c = self.config
        if c.token:
            return "Bearer " + c.token
        if c.token_file:
            with self._token_lock:
                now = self._clock()
                if not self._token or now - self._token_at >= self._refresh_s:
                    try:
                        self._token = read_token(c.token_file)
                    except KubeConfigError:
                        if not self._token:
                            raise
                    self._token_at = now  # an unreadable new token: keep the last one a while
                return "Bearer " + self._token
        if c.username:
            pair = f"{c.username}:{c.password}".encode()
            return "Basic " + base64.b64encode(pair).decode("ascii")
        return ""


def _tls_context(c: ClusterConfig) -> ssl.SSLContext:
    """Verification against the configured CA (else the system's), a client
    certificate if configured; raises KubeConfigError naming the bad part."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    where = c.source or "configuration"
    if c.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif c.ca_data or c.ca_file:
        pem = c.ca_data or read_pem(c.ca_file, "certificate authority")
        try:
            ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError) as e:
            raise KubeConfigError(f"{where}: certificate authority is not PEM: {e}") from None
    else:
        ctx.load_default_certs()
    if c.cert_data or c.cert_file:
        cert = c.cert_data or read_pem(c.cert_file, "client certificate")
        key = c.key_data or (read_pem(c.key_file, "client key") if c.key_file else b"")
        _load_client_cert(ctx, cert, key, where)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, cert: bytes, key: bytes, where: str) -> None:
    """ssl loads certificates from files only: through a private temporary directory."""
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-") as d:
        paths = []
        for name, data in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(d, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(path)
        try:
            ctx.load_cert_chain(paths[0], paths[1] if key else None)
        except (ssl.SSLError, ValueError) as e:
            why = getattr(e, "reason", None) or e
            raise KubeConfigError(
                f"{where}: client certificate and key do not load ({why}); "
                f"check client-certificate and client-key"
            ) from None
