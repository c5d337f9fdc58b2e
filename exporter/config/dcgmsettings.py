"""dcgm-exporter's flags of 4.8.3 and later, resolved into the Config fields they set.

``--config-file`` is read first, so that its values sit below every flag and
variable (flag > environment > config file > default). The web timeouts set this
exporter's HTTP timeouts; an unparsable one is a warning and keeps the default, as
dcgm-exporter does. The other startup rules are dcgm-exporter's: ``--container-labels``
needs a socket (with ``-k`` it is ignored with a warning), ``--max-concurrent-scrapes``
must be positive, ``--dcgm-log-level`` one of DCGM's levels, ``--enable-pprof`` needs
``--web-config-file`` (these two only from 4.8.3: under ``--dcgm-exporter-version 4.8.2``
each is a warning), and DCGM's watch retention cannot keep nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from exporter.config.dcgmflags import BY_LONG, Resolver
from exporter.config.durations import parse_duration
from exporter.config.model import Config, ConfigError, parse_count, whole_number

if TYPE_CHECKING:
    from exporter.config import yamlfile

DCGM_LOG_LEVELS = ("NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG")
MAX_SCRAPES = 100_000
HTTP_TIMEOUT_S = (0.1, 3600.0)  # the range of --http-timeout and --http-write-timeout


def resolver(args: argparse.Namespace, env: Mapping[str, str]) -> Resolver:
    """The flag resolver, with the config file's values below flags and variables."""
    r = Resolver(args, env)
    path, src = r.flag("config-file")
    if path:
        from exporter.config import yamlfile

        try:
            fc = yamlfile.load(path)
        except yamlfile.FileError as e:
            raise ConfigError(f"{src}: {e}") from None
        r.file = {BY_LONG[k].dest: v for k, v in fc.values.items()}
        r.config = fc
    return r


def apply(r: Resolver, cfg: Config) -> Config:
    """``cfg`` with the settings of these flags (and the config file) in place."""
    fc: yamlfile.FileConfig | None = r.config
    notices: list[str] = []
    out: dict[str, Any] = {"config_file": fc.path if fc else None}
    if fc is not None:
        out["collections"] = fc.collections
        if fc.metrics_text is not None and r.flag("collectors")[0] is None:
            out["metrics_text"] = fc.metrics_text
            out["metrics_file"] = f"config file {fc.path}: metrics.fields"
        if fc.retention:
            notices.append(
                f"config file {fc.path}: {', '.join(fc.retention)}: DCGM's watch retention; "
                "accepted, no effect without DCGM"
            )
    out.update(_web_timeouts(r, notices))
    out["max_concurrent_scrapes"] = _scrapes(r)
    out["container_socket"] = _containers(r, cfg, notices)
    out["hpc_job_dir"] = r.flag("hpc-job-mapping-dir")[0] or None
    out["health_require_gpus"] = r.dcgm_boolean("health-require-gpus")
    if _given(r, "enable-exporter-metrics") and not r.dcgm_boolean("enable-exporter-metrics"):
        notices.append(
            "--enable-exporter-metrics false: the exporter's own metrics (gpu_exporter_*, "
            "process_*) are always served; its alerts and /ready rely on them"
        )
    _retention(r)
    _dcgm_only_checks(r, cfg, notices)
    if cfg.web_systemd_socket:
        out["systemd_fds"] = systemd_fds(r.env)
    out["notices"] = cfg.notices + tuple(notices)
    return dataclasses.replace(cfg, **out)


def _given(r: Resolver, long: str) -> bool:
    f = BY_LONG[long]
    return getattr(r.args, f.dest) is not None or r.env.get(f.env, "") != "" or f.dest in r.file


def _own_given(r: Resolver, dest: str, env: str) -> bool:
    return getattr(r.args, dest) is not None or r.env.get(env, "") != ""


def _web_timeouts(r: Resolver, notices: list[str]) -> dict[str, float]:
    """--web-read-timeout / --web-write-timeout onto --http-timeout / --http-write-timeout
    (this exporter's own flags win when both are given)."""
    out = {}
    for long, field, dest, env in (
        ("web-read-timeout", "http_timeout_s", "http_timeout", "GPU_EXPORTER_HTTP_TIMEOUT"),
        ("web-write-timeout", "http_write_timeout_s", "http_write_timeout",
         "GPU_EXPORTER_HTTP_WRITE_TIMEOUT"),
    ):  # fmt: skip
        value, src = r.flag(long)
        if value is None or _own_given(r, dest, env):
            continue
        try:
            seconds = parse_duration(value)
        except ValueError:
            notices.append(f"{src}: {value[:40]!r} is not a Go duration (e.g. 10s); "
                           "keeping the default")  # fmt: skip
            continue
        lo, hi = HTTP_TIMEOUT_S
        if not lo <= seconds <= hi:
            notices.append(f"{src}: {value[:60]!r} is outside {lo:g}s..{hi:g}s (0 would mean no "
                           "timeout); keeping the default")  # fmt: skip
            continue
        out[field] = seconds
    return out


def _scrapes(r: Resolver) -> int:
    value, src = r.flag("max-concurrent-scrapes")
    if value is None:
        return 16
    n = parse_count(value, src, "a number of scrapes", -(10**9), MAX_SCRAPES)
    if n <= 0:
        raise ConfigError(f"{src}: {value[:60]!r}: give a positive number of scrapes (default 16)")
    return n


def _containers(r: Resolver, cfg: Config, notices: list[str]) -> str | None:
    """The container runtime socket when --container-labels is on and applies."""
    if not r.dcgm_boolean("container-labels"):
        return None
    if cfg.kube is not None:
        notices.append("--container-labels: ignored with -k (pods name the containers)")
        return None
    socket, _ = r.flag("container-runtime-socket")
    if not socket:
        raise ConfigError(
            "--container-labels needs --container-runtime-socket (the Docker-compatible API's "
            "unix socket, e.g. /var/run/docker.sock) or -k"
        )
    return socket


def _retention(r: Resolver) -> None:
    """DCGM's watch retention flags: validated as dcgm-exporter does, no effect here."""
    age = samples = None
    value, src = r.flag("watch-max-keep-age")
    if value is not None:
        try:
            age = parse_duration(value)
        except ValueError:
            age = -1.0
        if age < 0:
            raise ConfigError(f"{src}: {value[:40]!r} is not a duration of 0 or more (e.g. 10m)")
    value, src = r.flag("watch-max-keep-samples")
    if value is not None:
        samples = parse_count(value, src, "a number of samples", 0, 2147483647)
    if age == 0 and samples == 0:
        raise ConfigError(
            "--watch-max-keep-age and --watch-max-keep-samples are both 0: DCGM would keep "
            "no samples; give one of them a limit"
        )


def _dcgm_only_checks(r: Resolver, cfg: Config, notices: list[str]) -> None:
    """dcgm-exporter 4.8.3's startup errors; under 4.8.2, which had none, warnings."""
    problems = []
    value, src = r.flag("dcgm-log-level")
    if value is not None and value.upper() not in DCGM_LOG_LEVELS:
        problems.append(f"{src}: {value[:40]!r} is not a DCGM log level; use "
                        f"{', '.join(DCGM_LOG_LEVELS)}")  # fmt: skip
    if r.dcgm_boolean("enable-pprof") and not cfg.web_config_file:
        problems.append(
            "--enable-pprof needs --web-config-file (as dcgm-exporter: profiling endpoints "
            "only behind TLS or basic auth); drop --enable-pprof, it has no effect here"
        )
    if problems and cfg.release.strict_flags:
        raise ConfigError(problems[0])
    why = f"accepted, as dcgm-exporter {cfg.release.name} accepts it"
    notices.extend(f"{p} ({why})" for p in problems)


def systemd_fds(env: Mapping[str, str]) -> tuple[int, ...]:
    """The listening sockets systemd passed this process: fd 3 on (sd_listen_fds(3))."""
    pid = whole_number(env.get("LISTEN_PID", ""))
    count = whole_number(env.get("LISTEN_FDS", ""))
    hint = "start the exporter from a systemd .socket unit, or drop --web-systemd-socket"
    if pid != os.getpid():
        raise ConfigError(f"--web-systemd-socket: LISTEN_PID does not name this process; {hint}")
    if count is None or not 1 <= count <= 64:
        raise ConfigError(f"--web-systemd-socket: LISTEN_FDS names no socket; {hint}")
    return tuple(range(3, 3 + count))
