"""TLS for the web config: Go's names for versions, suites and client auth, the settings
parsed from ``tls_server_config``, and the server SSLContext built from them."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names for the suites a Go server can be told to use, as OpenSSL names them. TLS 1.3
# suites are not configurable in Go either: they are accepted and change nothing.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
DEFAULT_CIPHERS = ":".join(
    c["name"]
    for c in ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).get_ciphers()
    if c["protocol"] != "TLSv1.3"
)
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """``tls_server_config`` with relative paths resolved against the file's folder."""

    cert_file: str
    key_file: str
    verify_mode: ssl.VerifyMode
    client_ca_file: str | None = None
    client_ca: str | None = None
    allowed_sans: frozenset[str] | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: str | None = None
    prefer_server_ciphers: bool = True

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)


def server_context(tls: TLSSettings) -> ssl.SSLContext:
    """A server SSLContext for the settings; raises ValueError naming the file that failed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tune(ctx, tls)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {_reason(e)}"
        ) from e
    try:
        if tls.client_ca_file:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca:
            ctx.load_verify_locations(cadata=tls.client_ca)
    except (OSError, ssl.SSLError) as e:
        where = tls.client_ca_file or "client_ca"
        raise ValueError(f"cannot load client CA {where}: {_reason(e)}") from e
    return ctx


def tune(ctx: ssl.SSLContext, tls: TLSSettings) -> None:
    """The settings a connection copies from the context it starts with (see WebState)."""
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    ctx.verify_mode = tls.verify_mode
    ctx.set_ciphers(tls.ciphers or DEFAULT_CIPHERS)
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
