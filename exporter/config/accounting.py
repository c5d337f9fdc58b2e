"""The GPU accounting flags: the idle threshold, the retention of ended holders and the
directory the counters are kept in across restarts."""

from __future__ import annotations

import argparse
import os
from typing import Any

from exporter.config.dcgmflags import Resolver
from exporter.config.model import (
    DEFAULT_ACCOUNTING_RETENTION_MS,
    DEFAULT_IDLE_THRESHOLD_PERCENT,
    ConfigError,
    parse_count,
)


def add_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--accounting-idle-threshold",
        metavar="PERCENT",
        help="GPU accounting: a holder whose activity is below this counts as idle "
        "(env GPU_EXPORTER_ACCOUNTING_IDLE_THRESHOLD; default "
        f"{DEFAULT_IDLE_THRESHOLD_PERCENT})",
    )
    g.add_argument(
        "--accounting-retention",
        metavar="MS",
        help="GPU accounting: how long the series of a holder that ended keep their final "
        "values (env GPU_EXPORTER_ACCOUNTING_RETENTION; default "
        f"{DEFAULT_ACCOUNTING_RETENTION_MS})",
    )
    g.add_argument(
        "--accounting-state-dir",
        metavar="DIR",
        help="GPU accounting: a directory on the node where the counters are kept across "
        "restarts (env GPU_EXPORTER_ACCOUNTING_STATE_DIR; default: not kept)",
    )


def config(r: Resolver) -> dict[str, Any]:
    """The Config fields of the accounting flags given; ConfigError naming a bad one."""
    out: dict[str, Any] = {}
    value, src = r.value(
        "accounting_idle_threshold",
        "--accounting-idle-threshold",
        "GPU_EXPORTER_ACCOUNTING_IDLE_THRESHOLD",
    )
    if value is not None:
        out["accounting_idle_below"] = parse_count(value, src, "a percentage", 0, 100) / 100
    value, src = r.value(
        "accounting_retention", "--accounting-retention", "GPU_EXPORTER_ACCOUNTING_RETENTION"
    )
    if value is not None:
        ms = parse_count(value, src, "a retention in milliseconds", 0, 86_400_000)
        out["accounting_retention_s"] = ms / 1000
    value, src = r.value(
        "accounting_state_dir", "--accounting-state-dir", "GPU_EXPORTER_ACCOUNTING_STATE_DIR"
    )
    if value:
        path = str(value)
        if "\0" in path or len(path) > 4096:
            raise ConfigError(f"{src}: not a directory path: {path[:80]!r}")
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"{src}: {path} is not a directory")
        out["accounting_state_dir"] = path
    return out
