"""The frozen configuration every part of the exporter reads, and its validation."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from exporter.config.releases import DEFAULT as DEFAULT_RELEASE
from exporter.config.releases import Release

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


def default_metrics_file(release: Release = DEFAULT_RELEASE) -> str:
    """The metrics file shipped inside the package for ``release`` (metrics.csv: 4.8.4)."""
    return str(resources.files("exporter.catalog") / release.metrics_file)


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """``-d/--devices``: ``f`` each GPU (its instances when MIG is on), ``g`` GPUs only,
    ``i`` GPU instances only, ``g+i`` both; ``ids`` None means all of them (for ``g+i``
    the GPU IDs, ``instance_ids`` the GPU-instance IDs)."""

    mode: str = "f"
    ids: frozenset[int] | None = None
    instance_ids: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class Collection:
    """A collection of the config file read at its own interval: the metrics-file fields
    its glob ``patterns`` match (over the names as written and the DCGM names)."""

    name: str
    interval_s: float
    patterns: tuple[str, ...]
    where: str = ""  # the config file and key, for messages


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
    hostname_label: str = DEFAULT_RELEASE.hostname_label
    release: Release = DEFAULT_RELEASE  # --dcgm-exporter-version: the release mimicked
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
    web_systemd_socket: bool = False  # --web-systemd-socket (its sockets: systemd_fds)
    http_write_timeout_s: float = DEFAULT_HTTP_WRITE_TIMEOUT_MS / 1000  # client not reading
    http_max_header_bytes: int = DEFAULT_HTTP_MAX_HEADER_BYTES  # one request's headers, total
    auth_excluded_paths: tuple[str, ...] = DEFAULT_AUTH_EXCLUDED  # served without basic auth
    # dcgm-exporter 4.8.3 and later (exporter/config/dcgmsettings.py)
    config_file: str | None = None  # --config-file (YAML), read once at start
    metrics_text: str | None = None  # the config file's metrics.fields, as metrics-file text
    collections: tuple[Collection, ...] = ()  # read at their own interval; the rest at interval_s
    max_concurrent_scrapes: int = 16  # /metrics requests answered at once; past it 503
    container_socket: str | None = None  # --container-labels: Docker-compatible API socket
    hpc_job_dir: str | None = None  # --hpc-job-mapping-dir: <gpu>[.<gi>] files of job IDs
    health_require_gpus: bool = False  # /health 503 while no GPU is collected
    systemd_fds: tuple[int, ...] = ()  # --web-systemd-socket: the sockets systemd passed
    notices: tuple[str, ...] = ()  # startup warnings about these settings, one line each
    # where XIDs 79/119/120 are read from: None the default (/dev/kmsg, or the simulated
    # driver's log with --simulate), "" not at all (NVML events only)
    kernel_log: str | None = None
    accounting_idle_below: float = DEFAULT_IDLE_THRESHOLD_PERCENT / 100  # activity 0..1
    accounting_retention_s: float = DEFAULT_ACCOUNTING_RETENTION_MS / 1000
    accounting_state_dir: str = ""  # where the counters are kept across restarts; "": not kept


_WHOLE = re.compile(r"-?[0-9]{1,15}")


def whole_number(value: str) -> int | None:
    """A whole number written in ASCII digits (at most 15, an optional ``-``, spaces
    around), or None: no Unicode digits, underscores or ``+``, which int() would take,
    and no number long enough to cost time or fail int()'s digit limit."""
    text = value.strip(" \t\r\n")
    return int(text) if _WHOLE.fullmatch(text) else None


def parse_address(value: str, source: str) -> tuple[str, int]:
    """``[host]:port`` -> (host, port); host "" means every interface."""
    host, sep, port_text = value.rpartition(":")
    port = whole_number(port_text) if port_text.isdigit() else None
    if not sep or port is None or not 0 < port < 65536:
        raise ConfigError(
            f"{source}: {value[:60]!r} is not an address; use [host]:port, e.g. :9400 or "
            "127.0.0.1:9400"
        )
    host = host.strip("[]")
    return host, port


def parse_interval(value: str, source: str) -> float:
    """Milliseconds (dcgm-exporter's unit) -> seconds."""
    ms = whole_number(value)
    if ms is None or ms < MIN_INTERVAL_MS:
        raise ConfigError(
            f"{source}: {value[:60]!r} is not a collection interval; give milliseconds, "
            f"at least {MIN_INTERVAL_MS} (default {DEFAULT_INTERVAL_MS})"
        )
    return ms / 1000


def parse_count(value: str, source: str, what: str, lo: int, hi: int) -> int:
    """A whole number from ``lo`` to ``hi``; ConfigError naming the input otherwise."""
    n = whole_number(value)
    if n is None or not lo <= n <= hi:
        raise ConfigError(
            f"{source}: {value[:60]!r} is not {what}; give a number from {lo} to {hi}"
        )
    return n


DEFAULT_KERNEL_LOG = "/dev/kmsg"


def check_kernel_log(path: str, source: str) -> str:
    """A kernel log given on purpose must be readable; "" turns it off."""
    if path and not os.access(path, os.R_OK):
        raise ConfigError(
            f"{source}: cannot read the kernel log {path!r}; give a readable one (/dev/kmsg "
            "needs a privileged container: the privileged-xids deploy component), or an "
            "empty value to count XIDs 79, 119 and 120 from NVML events only"
        )
    return path


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
        raise ConfigError(f"{source}: {value[:60]!r} is not a regular expression: {e}") from None
    return value


def parse_bool(value: str, source: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads it (dcgm-exporter's environment values)."""
    v = value.strip()
    if v in _GO_TRUE:
        return True
    if v in _GO_FALSE:
        return False
    raise ConfigError(f"{source}: {value[:60]!r} is not a boolean; use true or false")


def parse_window(value: str, source: str) -> float:
    """A count window in milliseconds (1 ms to 7 days) -> seconds."""
    return parse_count(value, source, "a window in milliseconds", 1, 7 * 86_400_000) / 1000


def _id_range(part: str) -> range:
    lo, sep, hi = part.partition("-")
    first, last = whole_number(lo), whole_number(hi) if sep else whole_number(lo)
    if first is None or last is None or first < 0 or first > last or last > MAX_DEVICE_ID:
        raise ValueError(part)
    return range(first, last + 1)


def parse_devices(value: str, source: str) -> DeviceSelection:
    """``f``, ``g[:IDS]``, ``i[:IDS]`` or ``g[:IDS]+i[:IDS]`` (dcgm-exporter's -d syntax),
    IDS like ``0,2-4``."""
    hint = "use f, g, i, g:IDS, i:IDS or g:IDS+i:IDS with IDS like 0,2-4"
    parts = value.strip().split("+")
    picked: dict[str, frozenset[int] | None] = {}
    for part in parts:
        mode, sep, ids_text = part.strip().partition(":")
        if mode not in ("f", "g", "i") or (mode == "f" and (sep or len(parts) > 1)):
            raise ConfigError(f"{source}: {value[:60]!r} is not a device selection; {hint}")
        if mode in picked:
            raise ConfigError(f"{source}: {value[:60]!r} names {mode} twice; {hint}")
        picked[mode] = _ids(ids_text, value, source, hint) if sep else None
    if len(picked) == 1:
        mode, ids = next(iter(picked.items()))
        return DeviceSelection(mode, ids)
    return DeviceSelection("g+i", picked["g"], picked["i"])


def _ids(text: str, value: str, source: str, hint: str) -> frozenset[int]:
    ids: set[int] = set()
    try:
        for part in text.split(","):
            ids.update(_id_range(part))
    except ValueError as e:
        raise ConfigError(
            f"{source}: {value[:60]!r}: {str(e)!r} is not an ID or range from 0 to "
            f"{MAX_DEVICE_ID} (a-b with a <= b); {hint}"
        ) from None
    return frozenset(ids)
