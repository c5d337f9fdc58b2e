"""An HTTPS API-server stub on 127.0.0.1 with certificates made on the spot, for tests
of the API client's TLS, authentication and error handling.

Paths: ``/ok`` answers a small JSON object; ``/status/<code>`` a Kubernetes Status
object with that HTTP status; ``/cut`` a chunked answer that stops mid-line and
closes; ``/stall`` sends its headers, then nothing until the test ends. Every
request's Authorization header and client-certificate common name are recorded.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Pair = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def issue(cn: str, issuer: Pair | None = None, sans: tuple[str, ...] = ()) -> Pair:
    """A certificate for ``cn`` signed by ``issuer`` (self-signed CA if None);
    ``sans``: DNS names or IP addresses."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
    )
    if sans:
        alt = [_san(s) for s in sans]
        b = b.add_extension(x509.SubjectAlternativeName(alt), False)
    return b.sign(issuer[1] if issuer else key, hashes.SHA256()), key


def _san(s: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(s))
    except ValueError:
        return x509.DNSName(s)


def cert_pem(pair: Pair) -> bytes:
    return pair[0].public_bytes(serialization.Encoding.PEM)


def key_pem(pair: Pair) -> bytes:
    return pair[1].private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class TLSAPIServer:
    """Serves HTTPS with a certificate of ``ca`` for ``sans``; with ``client_ca``
    it requires a client certificate signed by it."""

    def __init__(
        self,
        tmp: Path,
        ca: Pair,
        sans: tuple[str, ...] = ("127.0.0.1",),
        client_ca: Pair | None = None,
    ) -> None:
        server = issue("apiserver", ca, sans)
        (tmp / "server.crt").write_bytes(cert_pem(server))
        (tmp / "server.key").write_bytes(key_pem(server))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tmp / "server.crt", tmp / "server.key")
        if client_ca is not None:
            (tmp / "client-ca.crt").write_bytes(cert_pem(client_ca))
            ctx.load_verify_locations(tmp / "client-ca.crt")
            ctx.verify_mode = ssl.CERT_REQUIRED
        self.auth: list[str] = []
        self.clients: list[str] = []
        self.release = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> TLSAPIServer:
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: TLSAPIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            server.auth.append(self.headers.get("Authorization", ""))
            peer = self.connection.getpeercert() or {}
            subject = dict(x[0] for x in peer.get("subject", ()))
            server.clients.append(subject.get("commonName", ""))
            if self.path == "/ok":
                self._json(200, {"kind": "APIGroup", "name": "ok"})
            elif self.path.startswith("/status/"):
                code = int(self.path.rsplit("/", 1)[1])
                self._json(code, {"kind": "Status", "code": code, "message": f"said {code}"})
            elif self.path in ("/cut", "/stall"):
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if self.path == "/cut":
                    line = b'{"type":"ADDED"}\n{"type":"MOD'
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                else:
                    server.release.wait(30)
                self.close_connection = True
            else:
                self._json(404, {"kind": "Status", "code": 404})

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
