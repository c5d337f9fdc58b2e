"""The web config file (exporter-toolkit's format): TLS, basic auth and response headers.

The file is loaded once at startup, where a bad file stops the exporter. It is then
re-read every few seconds and on SIGHUP. A change to the file, or to a certificate or CA
file it names, takes effect for new connections without a restart. A file that no longer
loads leaves the last good configuration in place, and the log says why. /health and
/ready never ask for a password, so that kubelet probes keep working (docs/security.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import secrets
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bcrypt
import yaml
from aiohttp import web

from exporter import reload
from exporter.config import ConfigError

log = logging.getLogger(__name__)

PROBES = frozenset({"/health", "/ready"})
"""Paths served without basic auth: the kubelet's probes carry no credentials."""

POLL_S = 5.0
"""How often the file and the files it names are checked for changes, seconds."""

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
BCRYPT_MAX_BYTES = 72

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


@dataclass(frozen=True, slots=True)
class WebConfig:
    """One loaded web config file."""

    path: str
    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    decoy: bytes = b""  # checked for unknown users, at the cost of the real hashes

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
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        seen: Fingerprint = ((path, _unreadable(e)),)
        raise WebConfigError(f"web config {path}: cannot read it: {e.strerror or e}", seen) from e
    seen = ((path, hashlib.sha256(raw).hexdigest()),)
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise WebConfigError(f"web config {path}: not valid YAML: {_yaml_problem(e)}", seen) from e
    try:
        cfg = parse(data, path)
    except ValueError as e:
        raise WebConfigError(f"web config {path}: {e}", seen) from e
    seen += _fingerprint(cfg.files[1:])  # read before they are loaded: a later change is seen
    context = None
    if cfg.tls is not None:
        try:
            context = server_context(cfg.tls)
        except ValueError as e:
            raise WebConfigError(f"web config {path}: {e}", seen) from e
    return Loaded(cfg, context, seen)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong and where, without PyYAML's snippet of the file: the line it quotes
    may hold a password hash (or a password put there by mistake), and this goes to the log."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(e, 'problem', None) or type(e).__name__}{where}"


def parse(data: Any, path: str) -> WebConfig:
    """The parsed file (``data`` from YAML) -> WebConfig; raises ValueError saying what is wrong."""
    if data is None:
        return WebConfig(path)
    top = _mapping(data, "the file", TOP_KEYS)
    folder = os.path.dirname(path)
    tls = _tls(top.get("tls_server_config"), folder)
    http = _mapping(top.get("http_server_config"), "http_server_config", HTTP_KEYS)
    if not isinstance(http.get("http2", True), bool):
        raise ValueError("http_server_config.http2: give true or false")
    headers = _headers(http.get("headers"))
    users = _users(top.get("basic_auth_users"))
    decoy = b""
    if users:
        cost = max(int(h[4:6]) for h in users.values())
        decoy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(cost))
    return WebConfig(path, tls, users, headers, decoy)


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
    """A digest of each file's content (or why it cannot be read): a change means reload."""
    out = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                out.append((p, hashlib.sha256(f.read()).hexdigest()))
        except OSError as e:
            out.append((p, _unreadable(e)))
    return tuple(out)


def _unreadable(e: OSError) -> str:
    return f"unreadable: {e.strerror or e}"


def server_context(tls: TLSSettings) -> ssl.SSLContext:
    """A server SSLContext for the settings; raises ValueError naming the file that failed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tune(ctx, tls)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as e:
        reason = getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
        raise ValueError(
            f"cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {reason}"
        ) from e
    try:
        if tls.client_ca_file:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca:
            ctx.load_verify_locations(cadata=tls.client_ca)
    except (OSError, ssl.SSLError) as e:
        reason = getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
        where = tls.client_ca_file or "client_ca"
        raise ValueError(f"cannot load client CA {where}: {reason}") from e
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


class WebState:
    """The configuration in force, and what swaps it when the files change.

    The listening socket keeps the SSLContext it was created with (``context``). New
    configurations are built into fresh contexts; a server-name callback, which OpenSSL
    calls for every handshake (with or without SNI), moves each new connection onto the
    newest one, which supplies the certificate and the client CA store. The settings a
    connection copies from the listening context before that callback (versions, client
    verification, ciphers) are written onto the listening context as well.
    """

    def __init__(self, loaded: Loaded) -> None:
        self.config = loaded.config
        self.context = loaded.context
        self._current = loaded.context
        self._seen = loaded.fingerprint
        self._ok: set[bytes] = set()
        self._bcrypt = asyncio.Semaphore(1)  # bcrypt is CPU-heavy: one at a time
        if self.context is not None:
            self.context.sni_callback = self._select

    def _select(self, conn: ssl.SSLObject, _name: str | None, ctx: ssl.SSLContext) -> None:
        if self._current is not None and self._current is not ctx:
            conn.context = self._current

    async def reload(self, force: bool = False) -> bool:
        """Reload when a watched file changed (or ``force``); True when a new config is in force."""
        loop = asyncio.get_running_loop()
        if not force:
            watched = [p for p, _ in self._seen]
            if await loop.run_in_executor(None, _fingerprint, watched) == self._seen:
                return False
        try:
            loaded = await loop.run_in_executor(None, load, self.config.path)
        except WebConfigError as e:
            self._seen = e.fingerprint  # retried when one of the files it read changes
            log.error("%s; still serving with the last good web config", e)
            return False
        self._seen = loaded.fingerprint
        if (loaded.context is None) != (self.context is None):
            log.error(
                "web config %s: switching between HTTP and HTTPS needs a restart; "
                "still serving with the last good web config",
                self.config.path,
            )
            return False
        self.apply(loaded)
        log.info("web config %s reloaded: %s", self.config.path, self.config.describe())
        return True

    def apply(self, loaded: Loaded) -> None:
        if loaded.context is not None and self.context is not None:
            assert loaded.config.tls is not None
            tune(self.context, loaded.config.tls)
            self._current = loaded.context
        self.config = loaded.config
        self._ok.clear()

    async def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries a configured user and its password."""
        user, password = _basic_credentials(header)
        if user is None:
            return False
        cfg = self.config
        hashed = cfg.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        if hashed is not None and key in self._ok:
            return True
        async with self._bcrypt:
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, _check, password, hashed or cfg.decoy)
        if ok and hashed is not None and cfg is self.config:
            if len(self._ok) > 256:
                self._ok.clear()
            self._ok.add(key)
        return ok and hashed is not None


def _basic_credentials(header: str | None) -> tuple[str | None, bytes]:
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None, b""
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        return (user.decode() if sep else None), password
    except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII text (a 500 before)
        return None, b""


def _check(password: bytes, hashed: bytes) -> bool:
    """bcrypt's own comparison, which takes the same time whether or not the password matches.
    Unknown users are checked against a decoy hash of the same cost, so they cost the same."""
    too_long = len(password) > BCRYPT_MAX_BYTES
    ok = bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed)
    return ok and not too_long


WEB = web.AppKey("web_config", WebState)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[WEB]
    cfg = state.config
    if cfg.tls is not None and cfg.tls.allowed_sans is not None:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        sans = {v for _, v in (peer or {}).get("subjectAltName", ())}
        if not sans & cfg.tls.allowed_sans:
            return web.Response(status=403, text="client certificate not allowed\n")
    resource = request.match_info.route.resource
    probe = resource is not None and resource.canonical in PROBES
    if cfg.users and not probe and not await state.authorized(request.headers.get("Authorization")):
        return web.Response(
            status=401,
            text="Unauthorized\n",
            headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'},
        )
    return await handler(request)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    state = request.app.get(WEB)
    if state is not None:
        response.headers.update(state.config.headers)


async def _watching(app: web.Application) -> AsyncIterator[None]:
    state = app[WEB]
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    hup = False
    # one SIGHUP handler per process: share the app's (reload.py) when it has one
    unsubscribe = reload.subscribe(app, wake.set)
    if unsubscribe is None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, wake.set)
            hup = True

    async def watch() -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), POLL_S)
            forced = wake.is_set()
            wake.clear()
            try:
                await state.reload(force=forced)
            except Exception:  # never let a surprise stop the watching
                log.exception("web config %s: reload failed", state.config.path)

    task = asyncio.create_task(watch(), name="web-config")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if unsubscribe is not None:
        unsubscribe()
    if hup:
        loop.remove_signal_handler(signal.SIGHUP)


def install(app: web.Application, path: str) -> WebState:
    """Load ``path`` and wire it into the app: basic auth, headers, reloading.

    Raises WebConfigError when the file cannot be used. Pass :func:`ssl_context` to the
    server to serve TLS.
    """
    state = WebState(load(path))
    app[WEB] = state
    app.middlewares.append(_guard)
    app.on_response_prepare.append(_add_headers)
    app.cleanup_ctx.append(_watching)
    log.info("web config %s: %s", path, state.config.describe())
    return state


def ssl_context(app: web.Application) -> ssl.SSLContext | None:
    """The TLS context to listen with, or None for plain HTTP."""
    state = app.get(WEB)
    return state.context if state is not None else None
