"""Command line: flags, then environment variables (dcgm-exporter's names), then defaults.

Exit codes: 0 after a clean stop (or a passing ``--check``), 1 on a runtime
failure, 2 on bad input (a flag, an environment value, the metrics file).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from exporter import __version__, webconfig
from exporter.catalog import CatalogError, load
from exporter.config import (
    DEFAULT_ADDRESS,
    DEFAULT_AUTH_EXCLUDED,
    DEFAULT_HTTP_MAX_HEADER_BYTES,
    DEFAULT_HTTP_TIMEOUT_MS,
    DEFAULT_HTTP_WRITE_TIMEOUT_MS,
    DEFAULT_INTERVAL_MS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SOCKET,
    Config,
    ConfigError,
    KubeConfig,
    check_file,
    check_regex,
    default_metrics_file,
    node_name,
    parse_address,
    parse_count,
    parse_interval,
)

log = logging.getLogger("exporter")

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs and MIG instances over NVML, "
        "with dcgm-exporter's metric names and labels. Each flag falls back to the "
        "environment variable named in its help, then to its default.",
    )
    p.add_argument(
        "-a",
        "--address",
        help=f"listen address [host]:port (env DCGM_EXPORTER_LISTEN; default {DEFAULT_ADDRESS})",
    )
    p.add_argument(
        "-c",
        "--collect-interval",
        metavar="MS",
        help="collection interval in milliseconds "
        f"(env DCGM_EXPORTER_INTERVAL; default {DEFAULT_INTERVAL_MS})",
    )
    p.add_argument(
        "-f",
        "--collectors",
        metavar="FILE",
        help="metrics file in dcgm-exporter's CSV format "
        "(env DCGM_EXPORTER_COLLECTORS; default: the metrics.csv shipped with the exporter)",
    )
    p.add_argument(
        "--collect-timeout",
        metavar="MS",
        help="longest a collection cycle may take before scrapes are served as stale "
        "(env GPU_EXPORTER_COLLECT_TIMEOUT; default: the interval, at most 10000)",
    )
    p.add_argument(
        "--hostname-label",
        choices=("Hostname", "hostname"),
        help="name of the node label: dcgm-exporter releases use Hostname, its main branch "
        "hostname (env GPU_EXPORTER_HOSTNAME_LABEL; default Hostname). The value is env "
        "NODE_NAME, else the host name",
    )
    p.add_argument(
        "--simulate",
        nargs="?",
        const="",
        metavar="FLEET.yaml",
        help="run against the simulated NVML driver; FLEET.yaml describes the node "
        "(default: 8x H100 with MIG on two GPUs) (env GPU_EXPORTER_SIMULATE)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="log level (env GPU_EXPORTER_LOG_LEVEL; default info)",
    )
    p.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS, basic auth and response headers, in exporter-toolkit's web config format; "
        "re-read when it or a file it names changes (env DCGM_EXPORTER_WEB_CONFIG_FILE; "
        "default: none, plain HTTP)",
    )
    p.add_argument(
        "--max-connections",
        metavar="N",
        help="most HTTP connections open at once; past it a new connection closes the oldest "
        "idle one (env GPU_EXPORTER_MAX_CONNECTIONS; default "
        f"{DEFAULT_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--http-timeout",
        metavar="MS",
        help="longest a connection may take to send a complete request (TLS handshake and "
        "headers), or stay idle between requests, before it is closed "
        f"(env GPU_EXPORTER_HTTP_TIMEOUT; default {DEFAULT_HTTP_TIMEOUT_MS})",
    )
    p.add_argument(
        "--http-write-timeout",
        metavar="MS",
        help="longest a client may stop reading a response before its connection is closed "
        f"(env GPU_EXPORTER_HTTP_WRITE_TIMEOUT; default {DEFAULT_HTTP_WRITE_TIMEOUT_MS})",
    )
    p.add_argument(
        "--http-max-header-bytes",
        metavar="N",
        help="largest total size of one request's headers; larger gets 431 "
        f"(env GPU_EXPORTER_HTTP_MAX_HEADER_BYTES; default {DEFAULT_HTTP_MAX_HEADER_BYTES})",
    )
    p.add_argument(
        "--web-auth-exclude",
        metavar="PATHS",
        help="comma-separated paths served without basic auth when the web config sets "
        "users; empty: none (env GPU_EXPORTER_WEB_AUTH_EXCLUDE; default "
        f"{','.join(DEFAULT_AUTH_EXCLUDED)}, the kubelet's probes)",
    )
    _kube_flags(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="validate flags and the metrics file, print what would be served, and exit",
    )
    p.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    return p


def _kube_flags(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("pod attribution (Kubernetes)")
    k.add_argument(
        "-k",
        "--kubernetes",
        action="store_true",
        default=None,
        help="add pod, namespace and container labels from the kubelet "
        "(env DCGM_EXPORTER_KUBERNETES=true)",
    )
    k.add_argument(
        "--pod-resources-kubelet-socket",
        metavar="PATH",
        help=f"kubelet pod-resources socket (env DCGM_POD_RESOURCES_KUBELET_SOCKET; "
        f"default {DEFAULT_SOCKET})",
    )
    k.add_argument(
        "--kubernetes-gpu-id-type",
        choices=("uid", "device-name"),
        help="device ID form the device plugin reports; both forms are recognised either way "
        "(env DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE; default uid)",
    )
    k.add_argument(
        "--nvidia-resource-names",
        metavar="NAMES",
        help="extra resource names holding NVIDIA GPUs, comma-separated, * allowed "
        "(env NVIDIA_RESOURCE_NAMES); nvidia.com/gpu, nvidia.com/gpu.shared and "
        "nvidia.com/mig-* are always read",
    )
    k.add_argument(
        "--kubernetes-enable-pod-uid",
        action="store_true",
        default=None,
        help="add a pod_uid label (needs the API server) "
        "(env DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID=true)",
    )
    k.add_argument(
        "--kubernetes-pod-labels",
        metavar="REGEX",
        help="copy pod labels whose names match REGEX, as label_<name> (needs the API server) "
        "(env GPU_EXPORTER_KUBERNETES_POD_LABELS)",
    )
    k.add_argument(
        "--kubernetes-dra",
        action="store_true",
        default=None,
        help="attribute DRA claims of gpu.nvidia.com through ResourceSlices (needs the API "
        "server) (env GPU_EXPORTER_KUBERNETES_DRA=true)",
    )
    k.add_argument(
        "--host-proc",
        metavar="PATH",
        help="the host's /proc, to map GPU processes to containers on shared GPUs "
        "(needs hostPID) (env GPU_EXPORTER_HOST_PROC; default /proc)",
    )


def _truthy(value: str | None, source: str) -> bool:
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{source}: {value!r} is not a boolean; use true or false")


def _kube_config(args: argparse.Namespace, env: Mapping[str, str], node: str) -> KubeConfig | None:
    def flag(value: bool | None, name: str) -> bool:
        return True if value else _truthy(env.get(name), f"environment variable {name}")

    if not flag(args.kubernetes, "DCGM_EXPORTER_KUBERNETES"):
        return None
    socket = args.pod_resources_kubelet_socket or env.get(
        "DCGM_POD_RESOURCES_KUBELET_SOCKET", DEFAULT_SOCKET
    )
    names = args.nvidia_resource_names or env.get("NVIDIA_RESOURCE_NAMES", "")
    id_type = args.kubernetes_gpu_id_type or env.get("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "uid")
    if id_type not in ("uid", "device-name"):
        raise ConfigError(
            f"environment variable DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE: {id_type!r}; "
            "use uid or device-name"
        )
    labels = args.kubernetes_pod_labels or env.get("GPU_EXPORTER_KUBERNETES_POD_LABELS") or None
    if labels:
        src = (
            "--kubernetes-pod-labels"
            if args.kubernetes_pod_labels
            else ("environment variable GPU_EXPORTER_KUBERNETES_POD_LABELS")
        )
        check_regex(labels, src)
    return KubeConfig(
        node_name=node,
        socket=socket,
        resource_names=tuple(n.strip() for n in names.split(",") if n.strip()),
        gpu_id_type=id_type,
        pod_uid=flag(args.kubernetes_enable_pod_uid, "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"),
        pod_labels=labels,
        dra=flag(args.kubernetes_dra, "GPU_EXPORTER_KUBERNETES_DRA"),
        host_proc=args.host_proc or env.get("GPU_EXPORTER_HOST_PROC", "/proc"),
    )


def config_from(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """Combine flags and environment into a Config; raises ConfigError naming the input."""

    def pick(flag: str | None, flag_name: str, env_name: str) -> tuple[str | None, str]:
        if flag is not None:
            return flag, flag_name
        if env.get(env_name):
            return env[env_name], f"environment variable {env_name}"
        return None, ""

    value, src = pick(args.address, "-a/--address", "DCGM_EXPORTER_LISTEN")
    host, port = parse_address(value or DEFAULT_ADDRESS, src or "default address")
    value, src = pick(args.collect_interval, "-c/--collect-interval", "DCGM_EXPORTER_INTERVAL")
    interval = parse_interval(value, src) if value is not None else DEFAULT_INTERVAL_MS / 1000
    value, src = pick(args.collect_timeout, "--collect-timeout", "GPU_EXPORTER_COLLECT_TIMEOUT")
    timeout = parse_interval(value, src) if value is not None else min(interval, 10.0)
    value, src = pick(args.collectors, "-f/--collectors", "DCGM_EXPORTER_COLLECTORS")
    metrics_file = check_file(value, src, "metrics file") if value else default_metrics_file()
    label, _ = pick(args.hostname_label, "--hostname-label", "GPU_EXPORTER_HOSTNAME_LABEL")
    if label not in (None, "Hostname", "hostname"):
        raise ConfigError(
            f"environment variable GPU_EXPORTER_HOSTNAME_LABEL: {label!r}; use Hostname or hostname"
        )
    sim, src = pick(args.simulate, "--simulate", "GPU_EXPORTER_SIMULATE")
    simulate = sim is not None
    fleet = sim or None
    if fleet and fleet not in ("1", "true"):
        check_file(fleet, src, "fleet file")
    else:
        fleet = None
    level, _ = pick(args.log_level, "--log-level", "GPU_EXPORTER_LOG_LEVEL")
    value, src = pick(args.web_config_file, "--web-config-file", "DCGM_EXPORTER_WEB_CONFIG_FILE")
    web_config = check_file(value, src, "web config file") if value else None
    value, src = pick(args.max_connections, "--max-connections", "GPU_EXPORTER_MAX_CONNECTIONS")
    max_conns = DEFAULT_MAX_CONNECTIONS
    if value is not None:
        max_conns = parse_count(value, src, "a connection limit", 1, 1_000_000)
    value, src = pick(args.http_timeout, "--http-timeout", "GPU_EXPORTER_HTTP_TIMEOUT")
    http_timeout = DEFAULT_HTTP_TIMEOUT_MS
    if value is not None:
        http_timeout = parse_count(value, src, "a timeout in milliseconds", 100, 3_600_000)
    http = _http_limits(args, env)
    hostname = node_name(env.get("NODE_NAME"))
    return Config(
        host=host,
        port=port,
        interval_s=interval,
        collect_timeout_s=timeout,
        metrics_file=metrics_file,
        hostname=hostname,
        hostname_label=label or "Hostname",
        simulate=simulate,
        fleet=fleet,
        log_level=(level or "info").lower(),
        check=args.check,
        web_config_file=web_config,
        kube=_kube_config(args, env, hostname),
        max_connections=max_conns,
        http_timeout_s=http_timeout / 1000,
        **http,
    )


def _http_limits(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """The HTTP write timeout, header budget and auth-excluded paths (Config fields)."""
    out: dict[str, Any] = {}

    def pick(flag: str | None, flag_name: str, env_name: str) -> tuple[str | None, str]:
        if flag is not None:
            return flag, flag_name
        if env.get(env_name):
            return env[env_name], f"environment variable {env_name}"
        return None, ""

    value, src = pick(
        args.http_write_timeout, "--http-write-timeout", "GPU_EXPORTER_HTTP_WRITE_TIMEOUT"
    )
    if value is not None:
        out["http_write_timeout_s"] = (
            parse_count(value, src, "a timeout in milliseconds", 100, 3_600_000) / 1000
        )
    value, src = pick(
        args.http_max_header_bytes, "--http-max-header-bytes", "GPU_EXPORTER_HTTP_MAX_HEADER_BYTES"
    )
    if value is not None:
        out["http_max_header_bytes"] = parse_count(value, src, "a size in bytes", 1024, 1 << 20)
    value, src = pick(args.web_auth_exclude, "--web-auth-exclude", "GPU_EXPORTER_WEB_AUTH_EXCLUDE")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args, os.environ)
        catalog = load(cfg.metrics_file)
        if cfg.web_config_file:
            webconfig.load(cfg.web_config_file)
    except (ConfigError, CatalogError) as e:
        print(f"gpu-exporter: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for s in catalog.skipped:
        log.warning("%s (%s:%d) not served: %s", s.name, catalog.path, s.line, s.reason)
    if cfg.check:
        names = ", ".join(m.name for m in catalog.metrics + catalog.labels)
        print(f"ok: {len(catalog.metrics)} metrics, {len(catalog.labels)} label fields: {names}")
        return 0
    if cfg.simulate:
        from exporter import sim

        try:
            sim.install(cfg.fleet)
        except ValueError as e:
            print(f"gpu-exporter: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        log.info("simulated NVML driver: %s", cfg.fleet or "default fleet (8x H100, 2 with MIG)")
    from exporter.app import run

    return run(cfg, catalog)
