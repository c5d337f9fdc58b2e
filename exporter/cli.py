"""Command line: flags, then environment variables (dcgm-exporter's names), then defaults.

Exit codes: 0 after a clean stop (or a passing ``--check``), 1 on a runtime
failure, 2 on bad input (a flag, an environment value, a file it names), always
as one line on stderr before anything is served.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from exporter import __version__
from exporter.config import accounting as accounting
from exporter.config import kube, validate
from exporter.config.dcgmflags import add_dcgm_flags
from exporter.config.model import (
    DEFAULT_AUTH_EXCLUDED,
    DEFAULT_HTTP_MAX_HEADER_BYTES,
    DEFAULT_HTTP_TIMEOUT_MS,
    DEFAULT_HTTP_WRITE_TIMEOUT_MS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SOCKET,
    LOG_LEVELS,
    Config,
    ConfigError,
)
from exporter.config.releases import DEFAULT, RELEASES
from exporter.config.resolve import config_from
from exporter.runtime import logsetup

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
        self.exit(EXIT_USAGE, f"{self.prog}: error: {validate.one_line(message)} (see --help)\n")


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
    kube.add_flags(g)
    g.add_argument(
        "--check",
        action="store_true",
        help="validate everything a start would (flags, metrics file, web config, fleet "
        "file, kubelet socket with -k), print what would be served, and exit 0 or 2",
    )
    return p


def _fail(message: str) -> int:
    print(f"gpu-exporter: error: {validate.one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


def _simulated_kubelet(args: argparse.Namespace, cfg: Config) -> bool:
    """Whether ``--simulate -k`` gets the simulator's own kubelet: no socket was given (flag,
    environment or config file), so the fleet's ``pods:`` are served (exporter/sim/kubelet.py)."""
    return (
        cfg.simulate
        and cfg.kube is not None
        and cfg.kube.socket == DEFAULT_SOCKET
        and args.pod_resources_kubelet_socket is None
        and "DCGM_POD_RESOURCES_KUBELET_SOCKET" not in os.environ
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args, os.environ)
    except ConfigError as e:
        return _fail(str(e))
    if cfg.check:
        if _simulated_kubelet(args, cfg):  # started with the simulator: nothing to reach yet
            cfg = dataclasses.replace(cfg, kube=None)
        return validate.run_check(cfg)
    catalog, problems = validate.validate(cfg)
    if problems or catalog is None:
        return _fail(problems[0])
    logsetup.configure(cfg.log_level, cfg.log_format)
    validate.log_startup(cfg, catalog)
    if cfg.simulate:
        from exporter import sim

        if cfg.kernel_log is None:  # the simulated driver's kernel log: in memory, not on disk
            log_path = f"/proc/self/fd/{os.memfd_create('gpu-exporter-sim-kmsg')}"
            cfg = dataclasses.replace(cfg, kernel_log=log_path if os.path.exists(log_path) else "")
        try:
            driver = sim.install(cfg.fleet, kernel_log=cfg.kernel_log or None)
        except ValueError as e:
            return _fail(str(e))
        if _simulated_kubelet(args, cfg) and cfg.kube is not None:
            from exporter.sim.kubelet import SimKubelet

            try:
                kubelet = SimKubelet(driver).start()
            except OSError as e:
                return _fail(
                    f"--simulate -k: cannot make the simulated kubelet's socket ({e}); "
                    "set a writable TMPDIR or --pod-resources-kubelet-socket"
                )
            atexit.register(kubelet.close)
            kube = dataclasses.replace(cfg.kube, socket=kubelet.socket)
            cfg = dataclasses.replace(cfg, kube=kube)
    from exporter.app import run

    return run(cfg, catalog)
