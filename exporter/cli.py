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
from typing import NoReturn

from exporter import __version__
from exporter.catalog import CatalogError, load
from exporter.config import (
    DEFAULT_ADDRESS,
    DEFAULT_INTERVAL_MS,
    Config,
    ConfigError,
    check_file,
    default_metrics_file,
    node_name,
    parse_address,
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
        "--check",
        action="store_true",
        help="validate flags and the metrics file, print what would be served, and exit",
    )
    p.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    return p


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
    return Config(
        host=host,
        port=port,
        interval_s=interval,
        collect_timeout_s=timeout,
        metrics_file=metrics_file,
        hostname=node_name(env.get("NODE_NAME")),
        hostname_label=label or "Hostname",
        simulate=simulate,
        fleet=fleet,
        log_level=(level or "info").lower(),
        check=args.check,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args, os.environ)
        catalog = load(cfg.metrics_file)
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
