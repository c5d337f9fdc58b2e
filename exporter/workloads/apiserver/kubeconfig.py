"""Where the API server is and how to authenticate to it: in-cluster or a kubeconfig.

Read the way the kubernetes clients read it: in a pod, from the environment
(KUBERNETES_SERVICE_HOST and _PORT) and the service account's token and CA
files; else from the kubeconfig named by KUBECONFIG (the first non-empty path
of a ``:``-separated list; files are not merged) or ~/.kube/config, its
current context. Supported in a kubeconfig: server (https:// or http://),
certificate-authority(-data), insecure-skip-tls-verify, tls-server-name; for
the user a token or tokenFile, a client certificate and key (files or -data),
or username and password. exec and auth-provider plugins are not run: an
error says so.

Files are read with a size bound and YAML without anchors or aliases (files.py).
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Any

from exporter.config.files import ConfigFileError, load_yaml, read_config_bytes, read_config_file

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_TOKEN_BYTES = 64 * 1024
"""Bound on a token file, bytes."""


class KubeConfigError(ValueError):
    """No usable configuration; the message names the input and what to do."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """How to reach one API server. ``*_data`` fields hold PEM bytes (decoded
    from the kubeconfig's base64); file fields are absolute paths. ``source``
    names where this came from, for error messages. The token, the password and
    the client key are left out of its repr (so of any log line or error that
    shows it), and a password in the server URL is masked there."""

    server: str
    source: str = ""
    ca_file: str = ""
    ca_data: bytes = b""
    insecure: bool = False
    tls_server_name: str = ""
    token: str = field(default="", repr=False)
    token_file: str = ""
    cert_file: str = ""
    cert_data: bytes = b""
    key_file: str = ""
    key_data: bytes = field(default=b"", repr=False)
    username: str = ""
    password: str = field(default="", repr=False)

    def __repr__(self) -> str:
        """The fields that are set, secrets and PEM data left out."""
        shown = {"server": masked(self.server)}
        shown.update((f, getattr(self, f)) for f in _SHOWN if getattr(self, f))
        return f"ClusterConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def masked(url: str) -> str:
    """``url`` with the password of its user information (``user:password@``) masked."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.partition("@")
    if not (sep and at) or "/" in userinfo or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"


_SHOWN = (
    "source", "ca_file", "insecure", "tls_server_name", "token_file", "cert_file", "key_file",
    "username",
)  # fmt: skip


def load(sa_dir: str = SERVICE_ACCOUNT_DIR, env: dict[str, str] | None = None) -> ClusterConfig:
    """In-cluster configuration if in a pod, else the kubeconfig; raises KubeConfigError
    naming both attempts."""
    env = dict(os.environ) if env is None else env
    try:
        return in_cluster(sa_dir, env)
    except KubeConfigError as not_in_cluster:
        paths = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p]
        path = paths[0] if paths else "~/.kube/config"
        try:
            return from_kubeconfig(os.path.expanduser(path))
        except KubeConfigError as e:
            raise KubeConfigError(
                f"no Kubernetes configuration: not in a cluster ({not_in_cluster}) and no "
                f"usable kubeconfig ({e})"
            ) from None


def in_cluster(
    sa_dir: str = SERVICE_ACCOUNT_DIR, env: dict[str, str] | None = None
) -> ClusterConfig:
    """The configuration of a pod: the API server's service address from the
    environment, the service account's token (re-read as it rotates) and CA."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token, ca = os.path.join(sa_dir, "token"), os.path.join(sa_dir, "ca.crt")
    for path in (token, ca):
        if not os.path.isfile(path):
            raise KubeConfigError(f"{path} is missing: is a service account token mounted?")
    read_token(token)  # fail now, not at the first request
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return ClusterConfig(
        server=f"https://{host}:{port}", source="in-cluster", ca_file=ca, token_file=token
    )


def read_token(path: str) -> str:
    """The token in ``path``, stripped; raises KubeConfigError if unreadable or empty."""
    try:
        token = read_config_file(path, "token file", MAX_TOKEN_BYTES).strip()
    except ConfigFileError as e:
        raise KubeConfigError(str(e)) from None
    if not token:
        raise KubeConfigError(f"token file {path}: empty")
    return token


def from_kubeconfig(path: str) -> ClusterConfig:
    """The current context's cluster and user of the kubeconfig at ``path``."""
    try:
        doc = load_yaml(read_config_file(path, "kubeconfig"), f"kubeconfig {path}")
    except ConfigFileError as e:
        raise KubeConfigError(str(e)) from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping)")
    name = doc.get("current-context")
    if not name:
        raise KubeConfigError(f"kubeconfig {path}: no current-context; set one with kubectl")
    context = _named(doc, "contexts", "context", name, path)
    cluster = _named(doc, "clusters", "cluster", context.get("cluster"), path)
    user = _named(doc, "users", "user", context.get("user"), path) if context.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(
            f"kubeconfig {path}: cluster {context.get('cluster')!r} has no https:// or "
            f"http:// server; set clusters[].cluster.server"
        )
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeConfigError(
                f"kubeconfig {path}: user {context.get('user')!r} uses an {plugin} plugin, "
                f"which this exporter does not run; give it a token, tokenFile or client "
                f"certificate instead"
            )
    return ClusterConfig(
        server=server.rstrip("/"),
        source=f"kubeconfig {path}",
        ca_file=_file(cluster, "certificate-authority", base),
        ca_data=_data(cluster, "certificate-authority-data", path),
        insecure=cluster.get("insecure-skip-tls-verify") is True,
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        token=str(user.get("token") or ""),
        token_file=_file(user, "tokenFile", base),
        cert_file=_file(user, "client-certificate", base),
        cert_data=_data(user, "client-certificate-data", path),
        key_file=_file(user, "client-key", base),
        key_data=_data(user, "client-key-data", path),
        username=str(user.get("username") or ""),
        password=str(user.get("password") or ""),
    )


def _named(doc: dict[str, Any], section: str, key: str, name: Any, path: str) -> dict[str, Any]:
    """The ``key`` mapping of the entry called ``name`` in ``doc[section]``."""
    for entry in doc.get(section) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                break
            return value
    raise KubeConfigError(f"kubeconfig {path}: no {key} named {name!r} in {section}")


def _file(section: dict[str, Any], key: str, base: str) -> str:
    value = section.get(key)
    return os.path.join(base, os.path.expanduser(str(value))) if value else ""


def _data(section: dict[str, Any], key: str, path: str) -> bytes:
    value = section.get(key)
    if not value:
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KubeConfigError(f"kubeconfig {path}: {key} is not valid base64") from None


def read_pem(path: str, what: str) -> bytes:
    """A PEM file's bytes (bounded); raises KubeConfigError naming it."""
    try:
        return read_config_bytes(path, what)
    except ConfigFileError as e:
        raise KubeConfigError(str(e)) from None
