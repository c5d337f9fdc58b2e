"""An HTTPS client on Python's ssl module (OpenSSL), and the exporter started with a web config."""

from __future__ import annotations

import base64
import http.client
import ssl
from pathlib import Path

from tests.procs import Exporter, wait_until


def tls_context(ca: Path | None, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca`` only (None: verifies nothing, like the kubelet)."""
    if ca is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def get(
    port: int,
    path: str,
    ctx: ssl.SSLContext | None = None,
    user: tuple[str, str] | None = None,
    host: str = "127.0.0.1",
) -> tuple[int, dict[str, str], bytes, bytes | None]:
    """(status, headers, body, server certificate DER) of one GET; TLS errors raise."""
    if ctx is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(host, port, timeout=10)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=10, context=ctx)
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        peer = conn.sock.getpeercert(binary_form=True) if ctx is not None else None
        return resp.status, dict(resp.getheaders()), resp.read(), peer
    finally:
        conn.close()


def start(web_config: Path, ctx: ssl.SSLContext | None) -> Exporter:
    """The exporter on the default simulated node with ``web_config``, once it is ready."""
    exp = Exporter("-c", "300", "--web-config-file", str(web_config))

    def ready() -> bool:
        if exp.proc.poll() is not None:
            raise AssertionError(f"exporter exited: {exp.output()}")
        try:
            return get(exp.port, "/ready", ctx)[0] == 200
        except (OSError, ssl.SSLError):
            return False

    try:
        wait_until(ready, 20, "the exporter to be ready over its web config")
    except AssertionError:
        exp.stop()
        raise
    return exp
