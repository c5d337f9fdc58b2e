"""Flags, environment variables and the config file resolved into one Config.

Each value comes from its flag, else its environment variable (dcgm-exporter's names,
then ours), else the config file, else the default; a bad value raises ConfigError
naming the flag or variable it came from.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from exporter.config import accounting, dcgmsettings, kube
from exporter.config.dcgmflags import Resolver
from exporter.config.model import (
    DEFAULT_ADDRESS,
    DEFAULT_HTTP_TIMEOUT_MS,
    DEFAULT_INTERVAL_MS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_WINDOW_MS,
    LOG_FORMATS,
    LOG_LEVELS,
    Config,
    ConfigError,
    DeviceSelection,
    check_file,
    check_kernel_log,
    default_metrics_file,
    node_name,
    parse_address,
    parse_bool,
    parse_count,
    parse_devices,
    parse_interval,
    parse_window,
)
from exporter.config.releases import ALIASES, DEFAULT, RELEASES, Release, parse_release


def _simulate(r: Resolver) -> tuple[bool, str | None]:
    """(simulate, fleet file): env true/false as a Go boolean, anything else a fleet file."""
    value, src = r.value("simulate", "--simulate", "GPU_EXPORTER_SIMULATE")
    if value is None:
        return False, None
    if value == "":
        return True, None
    try:
        return parse_bool(value, src), None
    except ConfigError:
        return True, check_file(value, src, "fleet file")


def _logging(r: Resolver) -> tuple[str, str]:
    level, src = r.value("log_level", "--log-level", "GPU_EXPORTER_LOG_LEVEL")
    if r.dcgm_boolean("debug"):
        level = "debug"
    elif level is not None and level.lower() not in LOG_LEVELS:
        raise ConfigError(f"{src}: {level!r} is not a log level; use {', '.join(LOG_LEVELS)}")
    fmt, src = r.flag("log-format")
    if fmt is not None and fmt not in LOG_FORMATS:
        raise ConfigError(f"{src}: {fmt!r} is not a log format; use text or json")
    return (level or "info").lower(), fmt or "text"


def _windows(r: Resolver) -> tuple[float, float]:
    out = []
    for long in ("xid-count-window-size", "clock-events-count-window-size"):
        value, src = r.flag(long)
        out.append(parse_window(value, src) if value is not None else DEFAULT_WINDOW_MS / 1000)
    return out[0], out[1]


def _http(r: Resolver) -> tuple[int, int]:
    value, src = r.value("max_connections", "--max-connections", "GPU_EXPORTER_MAX_CONNECTIONS")
    max_conns = DEFAULT_MAX_CONNECTIONS
    if value is not None:
        max_conns = parse_count(value, src, "a connection limit", 1, 1_000_000)
    value, src = r.value("http_timeout", "--http-timeout", "GPU_EXPORTER_HTTP_TIMEOUT")
    http_timeout = DEFAULT_HTTP_TIMEOUT_MS
    if value is not None:
        http_timeout = parse_count(value, src, "a timeout in milliseconds", 100, 3_600_000)
    return max_conns, http_timeout


def _release(r: Resolver) -> Release:
    value, src = r.value(
        "dcgm_exporter_version", "--dcgm-exporter-version", "GPU_EXPORTER_DCGM_EXPORTER_VERSION"
    )
    if value is None:
        return DEFAULT
    got = parse_release(value)
    if got is None:
        names = ", ".join([*RELEASES, *ALIASES])
        raise ConfigError(f"{src}: {value!r} is not a dcgm-exporter release mimicked; use {names}")
    return got


def _hostname_label(r: Resolver, release: Release) -> str:
    label, src = r.value("hostname_label", "--hostname-label", "GPU_EXPORTER_HOSTNAME_LABEL")
    if label not in (None, "Hostname", "hostname"):
        raise ConfigError(f"{src}: {label!r} is not a label name; use Hostname or hostname")
    return label or release.hostname_label


def config_from(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """Combine flags, environment and config file into a Config; raises ConfigError naming
    the input."""
    r = dcgmsettings.resolver(args, env)
    value, src = r.flag("address")
    host, port = parse_address(value or DEFAULT_ADDRESS, src or "default address")
    value, src = r.flag("collect-interval")
    interval = parse_interval(value, src) if value is not None else DEFAULT_INTERVAL_MS / 1000
    value, src = r.value("collect_timeout", "--collect-timeout", "GPU_EXPORTER_COLLECT_TIMEOUT")
    timeout = parse_interval(value, src) if value is not None else min(interval, 10.0)
    release = _release(r)
    value, src = r.flag("collectors")
    metrics_file = (
        check_file(value, src, "metrics file") if value else default_metrics_file(release)
    )
    value, src = r.flag("web-config-file")
    web_config = check_file(value, src, "web config file") if value else None
    value, src = r.flag("devices")
    devices = parse_devices(value, src) if value is not None else DeviceSelection()
    simulate, fleet = _simulate(r)
    level, log_format = _logging(r)
    max_conns, http_timeout = _http(r)
    xid_window, clock_window = _windows(r)
    http = _http_limits(r)
    hostname = node_name(env.get("NODE_NAME"))
    cfg = Config(
        host=host,
        port=port,
        interval_s=interval,
        collect_timeout_s=timeout,
        metrics_file=metrics_file,
        hostname=hostname,
        hostname_label=_hostname_label(r, release),
        release=release,
        simulate=simulate,
        fleet=fleet,
        log_level=level,
        check=args.check,
        web_config_file=web_config,
        kube=kube.kube_config(r, hostname),
        max_connections=max_conns,
        http_timeout_s=http_timeout / 1000,
        devices=devices,
        xid_window_s=xid_window,
        clock_events_window_s=clock_window,
        no_hostname=r.dcgm_boolean("no-hostname"),
        old_names=r.dcgm_boolean("use-old-namespace"),
        replace_blanks_in_model_name=r.dcgm_boolean("replace-blanks-in-model-name"),
        log_format=log_format,
        no_effect=r.no_effect(),
        web_systemd_socket=r.dcgm_boolean("web-systemd-socket"),
        kernel_log=_kernel_log(r),
        **http,
        **accounting.config(r),
    )
    return dcgmsettings.apply(r, cfg)


def _kernel_log(r: Resolver) -> str | None:
    value, src = r.value("kernel_log", "--kernel-log", "GPU_EXPORTER_KERNEL_LOG")
    return None if value is None else check_kernel_log(value, src)


def _http_limits(r: Resolver) -> dict[str, Any]:
    """The HTTP write timeout, header budget and auth-excluded paths (Config fields)."""
    out: dict[str, Any] = {}
    value, src = r.value(
        "http_write_timeout", "--http-write-timeout", "GPU_EXPORTER_HTTP_WRITE_TIMEOUT"
    )
    if value is not None:
        out["http_write_timeout_s"] = (
            parse_count(value, src, "a timeout in milliseconds", 100, 3_600_000) / 1000
        )
    value, src = r.value(
        "http_max_header_bytes", "--http-max-header-bytes", "GPU_EXPORTER_HTTP_MAX_HEADER_BYTES"
    )
    if value is not None:
        out["http_max_header_bytes"] = parse_count(value, src, "a size in bytes", 1024, 1 << 20)
    value, src = r.value("web_auth_exclude", "--web-auth-exclude", "GPU_EXPORTER_WEB_AUTH_EXCLUDE")
    if value is not None:
        paths = tuple(p.strip() for p in value.split(",") if p.strip())
        unknown = [p for p in paths if p not in ("/", "/metrics", "/health", "/ready")]
        if unknown:
            raise ConfigError(
                f"{src}: unknown path(s) {', '.join(unknown)}; "
                "give some of /, /metrics, /health, /ready"
            )
        out["auth_excluded_paths"] = paths
    return out
