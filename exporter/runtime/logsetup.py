"""Logging: dcgm-exporter's two formats, text lines or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time

MAX_MESSAGE = 2000  # characters of one log message; the rest is cut


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "msg"}`` per record, like dcgm-exporter's slog JSON."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg = f"{msg}: {record.exc_info[1]!r}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return json.dumps(
            {
                "time": f"{stamp}.{int(record.msecs):03d}Z",
                "level": record.levelname,
                "logger": record.name,
                "msg": msg[:MAX_MESSAGE],
            },
            ensure_ascii=False,
        )


def configure(level: str, fmt: str) -> None:
    """Send every log record to stderr at ``level`` in format ``text`` or ``json``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
