"""What a start validates (the files the flags name), ``--check``, and the startup log."""

from __future__ import annotations

import importlib.util
import logging
import socket
import sys
from collections import defaultdict

from exporter import __version__
from exporter.catalog.groups import GroupError, resolve
from exporter.catalog.metricsfile import Catalog, CatalogError, load, parse
from exporter.config.model import Config

log = logging.getLogger("exporter")

MAX_LINE = 200  # characters of one --check listing line
MAX_ERROR = 400  # characters of one error message (a long value is cut in the middle)
KUBELET_TIMEOUT_S = 2.0
# What -k imports (module: distribution): the optional "kube" extra in pyproject.toml, h2
# with the two packages it needs (pip installs them with it), and protobuf.
KUBE_MODULES = {
    "h2": "h2",
    "hpack": "hpack",
    "hyperframe": "hyperframe",
    "google.protobuf": "protobuf",
}


def one_line(text: str, limit: int = MAX_ERROR) -> str:
    """``text`` on one line of at most ``limit`` characters, cut in the middle if longer."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = limit * 3 // 5
    return f"{text[:head]} ... {text[len(text) - (limit - head - 5) :]}"


def _listing(prefix: str, names: list[str], limit: int = MAX_LINE) -> str:
    """``prefix`` followed by as many names as fit in ``limit`` characters, then a count."""
    line = prefix
    for i, name in enumerate(names):
        more = f" and {len(names) - i} more"
        sep = ", " if i else " "
        if len(line) + len(sep) + len(name) + len(more) > limit and i < len(names) - 1:
            return line + more
        line += sep + name
    return line


def address_problem(host: str, port: int) -> str | None:
    """Why the exporter could not listen on ``host:port`` (bad host, port taken), or None."""
    where = f"-a/--address: {host or '*'}:{port}"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError) as e:
        return f"{where}: {host!r} is not a host this machine has ({e}); use an IP address of it"
    family, kind, proto, _, addr = infos[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        s.bind(addr)
    except OSError as e:
        return f"{where}: cannot listen there ({e.strerror or e}); pick another address or port"
    finally:
        s.close()
    return None


def kube_extra_problem() -> str | None:
    """Why -k cannot run here (a package of the "kube" extra is not installed), or None."""
    for name, dist in KUBE_MODULES.items():
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or blocked in sys.modules
            found = False
        if not found:
            return (
                f"-k (--kubernetes) needs the Python package {dist} ({name} cannot be "
                "imported): pip install gpu-exporter[kube]"
            )
    return None


def validate(cfg: Config) -> tuple[Catalog | None, list[str]]:
    """Check the address and load every file a start needs: the catalog, one line per problem."""
    problems: list[str] = []
    catalog = None
    if cfg.kube is not None and (problem := kube_extra_problem()):
        problems.append(problem)
    problem = None if cfg.systemd_fds else address_problem(cfg.host, cfg.port)
    if problem:
        problems.append(problem)
    dcgm47 = cfg.release.dcgm47
    try:
        if cfg.metrics_text is not None:  # the config file's metrics.fields
            catalog = parse(cfg.metrics_text, cfg.metrics_file, cfg.old_names, dcgm47)
        else:
            catalog = load(cfg.metrics_file, cfg.old_names, dcgm47)
        resolve(catalog, cfg.collections)
    except (CatalogError, GroupError) as e:
        problems.append(str(e))
        catalog = None
    if cfg.web_config_file:
        from exporter.http import webconfig

        try:
            webconfig.load(cfg.web_config_file)
        except ValueError as e:
            problems.append(f"--web-config-file: {e}")
    if cfg.simulate and cfg.fleet:
        from exporter.sim import load_fleet

        try:
            load_fleet(cfg.fleet)
        except ValueError as e:
            problems.append(f"--simulate: {e}")
    return catalog, problems


def kubelet_problem(path: str) -> str | None:
    """Why the kubelet's pod-resources socket at ``path`` cannot be reached, or None."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(KUBELET_TIMEOUT_S)
    try:
        s.connect(path)
    except OSError as e:
        return (
            f"--pod-resources-kubelet-socket: cannot connect to {path} "
            f"({e.strerror or e}); mount the kubelet's pod-resources directory or drop -k"
        )
    finally:
        s.close()
    return None


def run_check(cfg: Config) -> int:
    """``--check``: one line per problem on stderr, what would be served on stdout; 0 or 2."""
    catalog, problems = validate(cfg)
    if cfg.kube is not None:
        problem = kubelet_problem(cfg.kube.socket)
        if problem:
            problems.append(problem)
    for p in problems:
        print(f"gpu-exporter: error: {one_line(p)}", file=sys.stderr)
    if catalog is not None:
        names = [m.name for m in catalog.metrics + catalog.labels]
        verdict = "not ok (the errors above)" if problems else "ok"
        head = f"{verdict}: {len(catalog.metrics)} metrics, {len(catalog.labels)} label fields:"
        print(_listing(head, names))
        for line in skipped_lines(catalog):
            print(line)
        if (dup := duplicates_line(catalog)) is not None:
            print(f"warning: {dup}")
    return 2 if problems else 0


def duplicates_line(catalog: Catalog) -> str | None:
    """One line naming each field listed twice and both its lines, or None (bounded)."""
    if not catalog.duplicates:
        return None
    pairs = [f"{name} (lines {a} and {b})" for name, a, b in catalog.duplicates]
    head = f"{catalog.path}: names listed twice, each served once as its later row says:"
    return _listing(head, pairs, MAX_ERROR)


def skipped_summary(catalog: Catalog) -> str:
    """The startup warning about rows not served: how many, and their names (bounded)."""
    names = [s.name for s in catalog.skipped]
    n = len(names)
    head = (
        f"{n} row{'' if n == 1 else 's'} of {catalog.path} not served (DCGM fields NVML "
        "cannot serve; --check gives the reasons):"
    )
    return _listing(head, names, MAX_ERROR)


def skipped_lines(catalog: Catalog) -> list[str]:
    """Rows not served, one line per reason, each naming the fields (bounded)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for s in catalog.skipped:
        by_reason[s.reason].append(s.name)
    return [
        _listing(f"not served ({one_line(reason, 100)}):", names)
        for reason, names in by_reason.items()
    ]


def log_startup(cfg: Config, catalog: Catalog) -> None:
    """The startup lines: a handful at the default level, details at debug."""
    log.info(
        "gpu-exporter %s: metrics file %s, %d metrics, %d label fields",
        __version__,
        catalog.path,
        len(catalog.metrics),
        len(catalog.labels),
    )
    if catalog.skipped:
        log.warning("%s", skipped_summary(catalog))
        for line in skipped_lines(catalog):
            log.debug("%s", line)
    rates = catalog.rates_typed_counter()
    if rates:
        log.info(
            "%s types %s `counter`, as NVIDIA's CSV does, and they are served so; each is a "
            "throughput over the last interval, not a running total: query the value as it "
            "is (rate() or increase() over it is wrong)",
            catalog.path,
            ", ".join(rates),
        )
    if (dup := duplicates_line(catalog)) is not None:
        log.warning("%s", dup)
    if cfg.no_effect:
        log.warning("accepted, no effect without DCGM: %s", ", ".join(cfg.no_effect))
    for notice in cfg.notices:
        log.warning("%s", notice)
    for c in cfg.collections:
        log.info("collection %s: read every %g s (%s)", c.name, c.interval_s, c.where)
    if cfg.simulate:
        log.info("simulated NVML driver: %s", cfg.fleet or "default fleet (8x H100, 2 with MIG)")
