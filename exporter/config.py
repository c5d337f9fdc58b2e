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
DEFAULT_WINDOW_MS = 300000  # dcgm-exporter's XID and clock-event count windows
MAX_DEVICE_ID = 4095  # highest GPU or GPU-instance ID -d/--devices accepts
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
DEFAULT_HTTP_WRITE_TIMEOUT_MS = 15000
DEFAULT_HTTP_MAX_HEADER_BYTES = 16384
DEFAULT_AUTH_EXCLUDED = ("/health", "/ready")
DEFAULT_IDLE_THRESHOLD_PERCENT = 1  # GPU accounting: activity below it is idle
DEFAULT_ACCOUNTING_RETENTION_MS = 120000  # GPU accounting: ended holders' series kept


class ConfigError(ValueError):
    """A bad flag or environment value; the message names it and says what to do."""


def default_metrics_file() -> str:
    """The metrics.csv shipped inside the package."""
    return str(resources.files("exporter") / "metrics.csv")


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """``-d/--devices``: ``f`` each GPU (its instances when MIG is on), ``g`` GPUs only,
    ``i`` GPU instances only; ``ids`` None means all of them."""

    mode: str = "f"
    ids: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """What ``-k`` and its companion flags ask for."""

    node_name: str
    socket: str
    resource_names: tuple[str, ...] = ()
    pod_uid: bool = False
    pod_labels: str | None = None  # allow-list regex of pod label names
    dra: bool = False
    dcgm_pod_labels: bool = False  # --kubernetes-enable-pod-labels: labels under their own names
    pod_label_allowlist: tuple[str, ...] = ()  # regexes of label names; empty: all labels
    host_proc: str = "/proc"
    timeout_s: float = 5.0
    virtual_gpus: bool = False  # --kubernetes-virtual-gpus: one series per pod on shared GPUs


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
    devices: DeviceSelection = DeviceSelection()
    xid_window_s: float = DEFAULT_WINDOW_MS / 1000  # -x/--xid-count-window-size
    clock_events_window_s: float = DEFAULT_WINDOW_MS / 1000
    no_hostname: bool = False  # -n: no Hostname label
    old_names: bool = False  # -o: dcgm-exporter 1.x metric names
    replace_blanks_in_model_name: bool = False  # modelName "NVIDIA H100" -> "NVIDIA-H100"
    log_format: str = "text"  # or "json": one JSON object per log line
    no_effect: tuple[str, ...] = ()  # dcgm-exporter flags given that need DCGM
    web_systemd_socket: bool = False  # asked for; not supported, logged at startup
    http_write_timeout_s: float = DEFAULT_HTTP_WRITE_TIMEOUT_MS / 1000  # client not reading
    http_max_header_bytes: int = DEFAULT_HTTP_MAX_HEADER_BYTES  # one request's headers, total
    auth_excluded_paths: tuple[str, ...] = DEFAULT_AUTH_EXCLUDED  # served without basic auth
    accounting_idle_below: float = DEFAULT_IDLE_THRESHOLD_PERCENT / 100  # activity 0..1
    accounting_retention_s: float = DEFAULT_ACCOUNTING_RETENTION_MS / 1000


def _int(value: str) -> int | None:
    """A whole number of at most 15 digits, or None."""
    text = value.strip()
    if len(text) > 16:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_address(value: str, source: str) -> tuple[str, int]:
    """``[host]:port`` -> (host, port); host "" means every interface."""
    host, sep, port_text = value.rpartition(":")
    port = _int(port_text) if port_text.isdigit() else None
    if not sep or port is None or not 0 < port < 65536:
        raise ConfigError(
            f"{source}: {value!r} is not an address; use [host]:port, e.g. :9400 or 127.0.0.1:9400"
        )
    host = host.strip("[]")
    return host, port


def parse_interval(value: str, source: str) -> float:
    """Milliseconds (dcgm-exporter's unit) -> seconds."""
    ms = _int(value)
    if ms is None or ms < MIN_INTERVAL_MS:
        raise ConfigError(
            f"{source}: {value!r} is not a collection interval; give milliseconds, "
            f"at least {MIN_INTERVAL_MS} (default {DEFAULT_INTERVAL_MS})"
        )
    return ms / 1000


def parse_count(value: str, source: str, what: str, lo: int, hi: int) -> int:
    """A whole number from ``lo`` to ``hi``; ConfigError naming the input otherwise."""
    n = _int(value)
    if n is None or not lo <= n <= hi:
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


def parse_bool(value: str, source: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads it (dcgm-exporter's environment values)."""
    v = value.strip()
    if v in _GO_TRUE:
        return True
    if v in _GO_FALSE:
        return False
    raise ConfigError(f"{source}: {value!r} is not a boolean; use true or false")


def parse_window(value: str, source: str) -> float:
    """A count window in milliseconds (1 ms to 7 days) -> seconds."""
    return parse_count(value, source, "a window in milliseconds", 1, 7 * 86_400_000) / 1000


def _id_range(part: str) -> range:
    lo, sep, hi = part.partition("-")
    if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
        raise ValueError(part)
    first, last = int(lo), int(hi) if sep else int(lo)
    if first > last or last > MAX_DEVICE_ID:
        raise ValueError(part)
    return range(first, last + 1)


def parse_devices(value: str, source: str) -> DeviceSelection:
    """``f``, ``g``, ``i``, ``g:0,1`` or ``i:0,2-4`` (dcgm-exporter's -d syntax)."""
    mode, sep, ids_text = value.strip().partition(":")
    hint = "use f, g, i, g:IDS or i:IDS with IDS like 0,2-4"
    if mode not in ("f", "g", "i") or (sep and mode == "f"):
        raise ConfigError(f"{source}: {value!r} is not a device selection; {hint}")
    if not sep:
        return DeviceSelection(mode)
    ids: set[int] = set()
    try:
        for part in ids_text.split(","):
            ids.update(_id_range(part))
    except ValueError as e:
        raise ConfigError(
            f"{source}: {value!r}: {str(e)!r} is not an ID or range from 0 to "
            f"{MAX_DEVICE_ID}; {hint}"
        ) from None
    return DeviceSelection(mode, frozenset(ids))
