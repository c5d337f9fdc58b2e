"""The web config file (exporter-toolkit's format): reading, parsing and validation.

:func:`load` reads the file (a regular file of bounded size, YAML without anchors or
aliases), validates every field, builds the TLS context and records a digest of each
file it read, so that a watcher can tell when to reload. Errors name the file and the
field, never the file's content (it may hold password hashes).
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.config.files import ConfigFileError, load_yaml, read_config_bytes, read_config_file
from exporter.config.model import ConfigError
from exporter.http.webconfig.auth import decoy
from exporter.http.webconfig.tls import (
    CIPHERS,
    CLIENT_AUTH,
    TLS_VERSIONS,
    TLSSettings,
    server_context,
)

MAX_BYTES = 256 * 1024
"""Largest web config file read, bytes."""

# Response headers exporter-toolkit lets a file set, with the values it accepts (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
# Any of these set means TLS, as in exporter-toolkit.
TLS_ENABLING = (
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
)
TLS_STRINGS = (*TLS_ENABLING, "min_version", "max_version")
TLS_LISTS = ("client_allowed_sans", "cipher_suites", "curve_preferences")
TLS_KEYS = {*TLS_STRINGS, *TLS_LISTS, "prefer_server_cipher_suites"}
HTTP_KEYS = {"http2", "headers"}
BCRYPT_HASH = re.compile(r"^\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}$")

Fingerprint = tuple[tuple[str, str], ...]
"""(path, digest of its content or why it is unreadable) for each file a config reads."""


class WebConfigError(ConfigError):
    """The web config file, or a file it names, cannot be used; the message says why.

    ``fingerprint`` is what the attempt read, so that a retry can wait for a change.
    """

    def __init__(self, message: str, fingerprint: Fingerprint = ()) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


@dataclass(frozen=True, slots=True)
class WebConfig:
    """One loaded web config file. ``empty``: the file held no settings at all."""

    path: str
    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    empty: bool = False

    @property
    def files(self) -> tuple[str, ...]:
        return (self.path, *(self.tls.files if self.tls else ()))

    def describe(self) -> str:
        if self.tls is None:
            mode = "plain HTTP"
        else:
            clients = {
                ssl.CERT_NONE: "no client certificates",
                ssl.CERT_OPTIONAL: "client certificates verified when given",
                ssl.CERT_REQUIRED: "client certificates required",
            }[self.tls.verify_mode]
            mode = f"TLS ({clients})"
        auth = f"basic auth for {len(self.users)} user(s)" if self.users else "no basic auth"
        return f"{mode}, {auth}"


@dataclass(frozen=True, slots=True)
class Loaded:
    """A web config with the server TLS context built from it and the digest of what it read."""

    config: WebConfig
    context: ssl.SSLContext | None
    fingerprint: Fingerprint


def load(path: str) -> Loaded:
    """Read, validate and build; raises WebConfigError naming the file and the problem."""
    try:
        text = read_config_file(path, "web config", MAX_BYTES)
    except ConfigFileError as e:
        raise WebConfigError(str(e), ((path, f"unreadable: {e}"),)) from None
    seen: Fingerprint = ((path, hashlib.sha256(text.encode()).hexdigest()),)
    try:
        data = load_yaml(text, f"web config {path}")
    except ConfigFileError as e:
        raise WebConfigError(str(e), seen) from None
    try:
        cfg = parse(data, path)
    except ValueError as e:
        raise WebConfigError(f"web config {path}: {e}", seen) from None
    seen += _fingerprint(cfg.files[1:])  # read before they are loaded: a later change is seen
    context = None
    if cfg.tls is not None:
        try:
            context = server_context(cfg.tls)
        except ValueError as e:
            raise WebConfigError(f"web config {path}: {e}", seen) from None
    return Loaded(cfg, context, seen)


def parse(data: Any, path: str) -> WebConfig:
    """The parsed file (``data`` from YAML) -> WebConfig; raises ValueError saying what is wrong."""
    if data is None:
        return WebConfig(path, empty=True)
    top = _mapping(data, "the file", TOP_KEYS)
    folder = os.path.dirname(path)
    tls = _tls(top.get("tls_server_config"), folder)
    http = _mapping(top.get("http_server_config"), "http_server_config", HTTP_KEYS)
    if not isinstance(http.get("http2", True), bool):
        raise ValueError("http_server_config.http2: give true or false")
    headers = _headers(http.get("headers"))
    users = _users(top.get("basic_auth_users"))
    if users:
        decoy(max(int(h[4:6]) for h in users.values()))  # computed here, off the event loop
    return WebConfig(path, tls, users, headers)


def _mapping(value: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(keys))}"
        )
    return value


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of strings")
    return value


def _tls(value: Any, folder: str) -> TLSSettings | None:
    t = _mapping(value, "tls_server_config", TLS_KEYS)
    s = {k: _string(t.get(k), f"tls_server_config.{k}") for k in TLS_STRINGS}
    if not any(s[k] for k in TLS_ENABLING):
        return None  # plain HTTP
    if s["cert"] or s["key"]:
        raise ValueError(
            "tls_server_config: inline cert and key are not supported; put them in files and "
            "name them with cert_file and key_file"
        )
    if t.get("curve_preferences"):
        raise ValueError(
            "tls_server_config.curve_preferences is not supported: Python's ssl module cannot "
            "restrict key exchange to a list of curves; remove it to use OpenSSL's defaults"
        )
    for key in ("cert_file", "key_file"):
        if not s[key]:
            raise ValueError(f"tls_server_config: missing {key}")
    verify, ca_file, ca_text, sans = _client_auth(t, s, folder)
    prefer = t.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ValueError("tls_server_config.prefer_server_cipher_suites: give true or false")
    low, high = (_version(s, k, d) for k, d in (("min_version", "TLS12"), ("max_version", "TLS13")))
    if low > high:
        raise ValueError("tls_server_config: min_version is above max_version")
    return TLSSettings(
        cert_file=_resolve(folder, s["cert_file"]),
        key_file=_resolve(folder, s["key_file"]),
        verify_mode=verify,
        client_ca_file=ca_file,
        client_ca=ca_text,
        allowed_sans=sans,
        min_version=low,
        max_version=high,
        ciphers=_ciphers(t.get("cipher_suites")),
        prefer_server_ciphers=prefer,
    )


def _client_auth(
    t: dict[str, Any], s: dict[str, str], folder: str
) -> tuple[ssl.VerifyMode, str | None, str | None, frozenset[str] | None]:
    """(verify mode, CA file, inline CA, allowed SANs) from client_auth_type and its company."""
    auth = s["client_auth_type"]
    if auth not in CLIENT_AUTH:
        if auth in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert"):
            raise ValueError(
                f"tls_server_config.client_auth_type: {auth} is not supported (Python's ssl "
                "module cannot accept a client certificate without verifying it); use "
                "RequireAndVerifyClientCert with client_ca_file"
            )
        raise ValueError(
            f"tls_server_config.client_auth_type: {auth!r} is not one of "
            "NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
        )
    verify = CLIENT_AUTH[auth]
    ca_file = _resolve(folder, s["client_ca_file"]) or None
    ca_text = s["client_ca"] or None
    if ca_file and ca_text:
        raise ValueError("tls_server_config: give client_ca_file or client_ca, not both")
    if (ca_file or ca_text) and verify == ssl.CERT_NONE:
        raise ValueError(
            "tls_server_config: a client CA is set but client_auth_type is NoClientCert; "
            "set client_auth_type: RequireAndVerifyClientCert"
        )
    if verify != ssl.CERT_NONE and not (ca_file or ca_text):
        raise ValueError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
    sans = None
    if "client_allowed_sans" in t:
        where = "tls_server_config.client_allowed_sans"
        sans = frozenset(_strings(t["client_allowed_sans"], where))
        if verify != ssl.CERT_REQUIRED:
            raise ValueError(f"{where} needs client_auth_type: RequireAndVerifyClientCert")
    return verify, ca_file, ca_text, sans


def _version(s: dict[str, str], key: str, default: str) -> ssl.TLSVersion:
    name = s[key] or default
    if name not in TLS_VERSIONS:
        raise ValueError(
            f"tls_server_config.{key}: {name!r} is not one of {', '.join(TLS_VERSIONS)}"
        )
    return TLS_VERSIONS[name]


def _ciphers(value: Any) -> str | None:
    """Go's suite names -> an OpenSSL cipher list; None: OpenSSL's defaults."""
    suites = _strings(value, "tls_server_config.cipher_suites")
    unknown = [c for c in suites if c not in CIPHERS]
    if unknown:
        raise ValueError(f"tls_server_config.cipher_suites: unknown cipher(s) {', '.join(unknown)}")
    return ":".join(CIPHERS[c] for c in suites if CIPHERS[c]) or None


def _resolve(folder: str, name: str) -> str:
    """Relative to the config file's folder, as given: a mounted Secret's file is a symlink
    into a hidden folder, and resolving it would look for its neighbours in the wrong place."""
    if not name:
        return ""
    return os.path.normpath(os.path.join(folder, name))


def _headers(value: Any) -> dict[str, str]:
    headers = _mapping(value, "http_server_config.headers", set(HEADERS))
    out = {}
    for name, v in headers.items():
        text = _string(v, f"http_server_config.headers.{name}")
        allowed = HEADERS[name]
        if allowed is not None and text not in allowed:
            raise ValueError(
                f"http_server_config.headers.{name}: {text!r} is not one of {', '.join(allowed)}"
            )
        if text:
            out[name] = text
    return out


def _users(value: Any) -> dict[str, bytes]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("basic_auth_users: expected a mapping of user name to bcrypt hash")
    users = {}
    for name, hashed in value.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"basic_auth_users: {name!r} is not a user name")
        m = BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
        if m is None or not 4 <= int(m.group(1)) <= 31:
            raise ValueError(
                f"basic_auth_users.{name}: not a bcrypt hash (passwords are stored as bcrypt "
                "hashes only); make one with: htpasswd -nBC 10 '' | tr -d ':\\n'"
            )
        users[name] = hashed.encode()
    return users


def _fingerprint(paths: Sequence[str]) -> Fingerprint:
    """A digest of each file's content (or why it cannot be read): a change means reload.
    Only regular files are read, up to MAX_FILE_BYTES each."""
    out = []
    for p in paths:
        try:
            raw = read_config_bytes(p, "file", MAX_FILE_BYTES)
            out.append((p, hashlib.sha256(raw).hexdigest()))
        except ConfigFileError as e:
            out.append((p, f"unreadable: {e}"))
    return tuple(out)


def fingerprint(paths: Sequence[str]) -> Fingerprint:
    """Public alias of the digest function, for the watcher."""
    return _fingerprint(paths)


MAX_FILE_BYTES = 1 << 20
"""Largest certificate, key or CA file digested, bytes."""
