"""Command line: flags, then environment variables (dcgm-exporter's names), then defaults.

Exit codes: 0 after a clean stop (or a passing ``--check``), 1 on a runtime
failure, 2 on bad input (a flag, an environment value, a file it names), always
as one line on stderr before anything is served.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from exporter import __version__, checks, flags48, kubeflags, logsetup
from exporter.accounting import options as accounting
from exporter.config import (
    DEFAULT_ADDRESS,
    DEFAULT_AUTH_EXCLUDED,
    DEFAULT_HTTP_MAX_HEADER_BYTES,
    DEFAULT_HTTP_TIMEOUT_MS,
    DEFAULT_HTTP_WRITE_TIMEOUT_MS,
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
from exporter.flags import Resolver, add_dcgm_flags
from exporter.releases import ALIASES, DEFAULT, RELEASES, Release, parse_release

log = logging.getLogger("exporter")

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([self._go_form(a) for a in given], namespace)

    def _go_form(self, arg: str) -> str:
        """dcgm-exporter's parser (Go) takes -address and --f as well as --address and -f."""
        name, eq, value = arg.partition("=")
        known = self._option_string_actions
        if name in known or not name.startswith("-"):
            return arg
        alt = name[1:] if name.startswith("--") else "-" + name
        return alt + eq + value if alt in known else arg

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {checks.one_line(message)} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpu-exporter",
        allow_abbrev=False,  # dcgm-exporter takes no abbreviations; a typo is an error
        description="Prometheus exporter for NVIDIA GPUs and MIG instances over NVML, "
        "with dcgm-exporter's metric names and labels. Each flag falls back to the "
        "environment variable named in its help, then to its default.",
    )
    p.add_argument("-v", "--version", action="version", version=f"gpu-exporter {__version__}")
    add_dcgm_flags(p)
    g = p.add_argument_group("gpu-exporter flags", "this exporter's own")
    g.add_argument(
        "--collect-timeout",
        metavar="MS",
        help="longest a collection cycle may take before scrapes are served as stale "
        "(env GPU_EXPORTER_COLLECT_TIMEOUT; default: the interval, at most 10000)",
    )
    g.add_argument(
        "--dcgm-exporter-version",
        metavar="VERSION",
        help="the dcgm-exporter release to mimic: "
        f"{', '.join(RELEASES)}; picks the node label's name, GPU_CI_ID, the health labels "
        "and the shipped metrics file (4.9: DCGM 4.7 names and units) "
        f"(env GPU_EXPORTER_DCGM_EXPORTER_VERSION; default {DEFAULT.name})",
    )
    g.add_argument(
        "--hostname-label",
        choices=("Hostname", "hostname"),
        help="name of the node label, instead of the release's (Hostname up to 4.8.2, "
        "hostname since 4.8.3) (env GPU_EXPORTER_HOSTNAME_LABEL). The value is env "
        "NODE_NAME, else the host name",
    )
    g.add_argument(
        "--simulate",
        nargs="?",
        const="",
        metavar="FLEET.yaml",
        help="run against the simulated NVML driver; FLEET.yaml describes the node "
        "(default: 8x H100 with MIG on two GPUs) (env GPU_EXPORTER_SIMULATE: true, "
        "false or a fleet file)",
    )
    g.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help="log level (env GPU_EXPORTER_LOG_LEVEL; default info; --debug means debug)",
    )
    g.add_argument(
        "--max-connections",
        metavar="N",
        help="most HTTP connections open at once; past it a new connection closes one never "
        "answered, oldest first (env GPU_EXPORTER_MAX_CONNECTIONS; default "
        f"{DEFAULT_MAX_CONNECTIONS})",
    )
    g.add_argument(
        "--http-timeout",
        metavar="MS",
        help="longest a connection may take to send a complete request (TLS handshake and "
        "headers), or stay idle between requests, before it is closed "
        f"(env GPU_EXPORTER_HTTP_TIMEOUT; default {DEFAULT_HTTP_TIMEOUT_MS})",
    )
    g.add_argument(
        "--http-write-timeout",
        metavar="MS",
        help="longest a client may stop reading a response before its connection is closed "
        f"(env GPU_EXPORTER_HTTP_WRITE_TIMEOUT; default {DEFAULT_HTTP_WRITE_TIMEOUT_MS})",
    )
    g.add_argument(
        "--http-max-header-bytes",
        metavar="N",
        help="largest total size of one request's headers; larger gets 431 "
        f"(env GPU_EXPORTER_HTTP_MAX_HEADER_BYTES; default {DEFAULT_HTTP_MAX_HEADER_BYTES})",
    )
    g.add_argument(
        "--web-auth-exclude",
        metavar="PATHS",
        help="comma-separated paths served without basic auth when the web config sets "
        "users; empty: none (env GPU_EXPORTER_WEB_AUTH_EXCLUDE; default "
        f"{','.join(DEFAULT_AUTH_EXCLUDED)}, the kubelet's probes)",
    )
    g.add_argument(
        "--kernel-log",
        metavar="PATH",
        help="kernel log to read XIDs 79, 119 and 120 from, as DCGM does; empty: NVML events "
        "only (env GPU_EXPORTER_KERNEL_LOG; default /dev/kmsg, the simulated driver's with "
        "--simulate)",
    )
    accounting.add_flags(g)
    kubeflags.add_flags(g)
    g.add_argument(
        "--check",
        action="store_true",
        help="validate everything a start would (flags, metrics file, web config, fleet "
        "file, kubelet socket with -k), print what would be served, and exit 0 or 2",
    )
    return p


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
    r = flags48.resolver(args, env)
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
        kube=kubeflags.kube_config(r, hostname),
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
    return flags48.apply(r, cfg)


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


def _fail(message: str) -> int:
    print(f"gpu-exporter: error: {checks.one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args, os.environ)
    except ConfigError as e:
        return _fail(str(e))
    if cfg.check:
        return checks.run_check(cfg)
    catalog, problems = checks.validate(cfg)
    if problems or catalog is None:
        return _fail(problems[0])
    logsetup.configure(cfg.log_level, cfg.log_format)
    checks.log_startup(cfg, catalog)
    if cfg.simulate:
        from exporter import sim

        if cfg.kernel_log is None:  # the simulated driver's kernel log: in memory, not on disk
            log_path = f"/proc/self/fd/{os.memfd_create('gpu-exporter-sim-kmsg')}"
            cfg = dataclasses.replace(cfg, kernel_log=log_path if os.path.exists(log_path) else "")
        try:
            sim.install(cfg.fleet, kernel_log=cfg.kernel_log or None)
        except ValueError as e:
            return _fail(str(e))
    from exporter.app import run

    return run(cfg, catalog)
