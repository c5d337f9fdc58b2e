"""The frozen configuration every part of the exporter reads, and its validation."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DEFAULT_ADDRESS = ":9400"
DEFAULT_INTERVAL_MS = 30000
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MIN_INTERVAL_MS = 100  # GPM needs samples at least 100 ms apart
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_HTTP_TIMEOUT_MS = 15000


class ConfigError(ValueError):
    """A bad flag or environment value; the message names it and says what to do."""


def default_metrics_file() -> str:
    """The metrics.csv shipped inside the package."""
    return str(resources.files("exporter") / "metrics.csv")


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """What ``-k`` and its companion flags ask for."""

    node_name: str
    socket: str
    resource_names: tuple[str, ...] = ()
    gpu_id_type: str = "uid"
    pod_uid: bool = False
    pod_labels: str | None = None  # allow-list regex of pod label names
    dra: bool = False
    dcgm_pod_labels: bool = False  # --kubernetes-enable-pod-labels
    pod_label_allowlist: tuple[str, ...] = ()  # --kubernetes-pod-label-allowlist-regex
    host_proc: str = "/proc"
    timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the exporter is told at startup (flags, then environment, then defaults)."""

    host: str = ""
    port: int = 9400
    interval_s: float = DEFAULT_INTERVAL_MS / 1000
    collect_timeout_s: float = 10.0
    metrics_file: str = ""
    hostname: str = ""
    hostname_label: str = "Hostname"
    simulate: bool = False
    fleet: str | None = None
    log_level: str = "info"
    check: bool = False
    web_config_file: str | None = None
    kube: KubeConfig | None = None  # pod attribution, with -k/--kubernetes
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # HTTP connections open at once
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_MS / 1000  # to send a request, or idle


def parse_address(value: str, source: str) -> tuple[str, int]:
    """``[host]:port`` -> (host, port); host "" means every interface."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"{source}: {value!r} is not an address; use [host]:port, e.g. :9400 or 127.0.0.1:9400"
        )
    host = host.strip("[]")
    return host, int(port_text)


def parse_interval(value: str, source: str) -> float:
    """Milliseconds (dcgm-exporter's unit) -> seconds."""
    try:
        ms = int(value)
    except ValueError:
        ms = -1
    if ms < MIN_INTERVAL_MS:
        raise ConfigError(
            f"{source}: {value!r} is not a collection interval; give milliseconds, "
            f"at least {MIN_INTERVAL_MS} (default {DEFAULT_INTERVAL_MS})"
        )
    return ms / 1000


def parse_count(value: str, source: str, what: str, lo: int, hi: int) -> int:
    """A whole number from ``lo`` to ``hi``; ConfigError naming the input otherwise."""
    try:
        n = int(value)
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise ConfigError(f"{source}: {value!r} is not {what}; give a number from {lo} to {hi}")
    return n


def check_file(path: str, source: str, what: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"{source}: {what} {path!r} does not exist or is not a file")
    return path


def node_name(env_value: str | None) -> str:
    """The Hostname label: NODE_NAME when set, else this machine's host name."""
    return env_value or socket.gethostname()


def check_regex(value: str, source: str) -> str:
    """Validate a regular expression early, naming the flag it came from."""
    try:
        re.compile(value)
    except re.error as e:
        raise ConfigError(f"{source}: {value!r} is not a regular expression: {e}") from None
    return value
