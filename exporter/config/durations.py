"""Go's duration syntax (``time.ParseDuration``), as dcgm-exporter's duration flags and
its config file take them: "300ms", "1.5h", "2h45m", "10s"; "0" alone needs no unit."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}  # fmt: skip
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)", re.ASCII)  # no Unicode digits
MAX_TEXT = 64  # characters; longer is not a duration anyone writes


def parse_duration(text: str) -> float:
    """Seconds of a Go duration; ValueError when ``text`` is not one.

    A sign is allowed as in Go ("-1s" is -1.0); each part needs a unit, so "10"
    is not a duration, while "0" is.
    """
    s = text
    if len(s) > MAX_TEXT:
        raise ValueError(text)
    sign = -1.0 if s.startswith("-") else 1.0
    s = s[1:] if s[:1] in "+-" else s
    if s == "0":
        return 0.0
    total, at = 0.0, 0
    while at < len(s):
        m = _PART.match(s, at)
        if m is None:
            raise ValueError(text)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        at = m.end()
    if at == 0:
        raise ValueError(text)
    return sign * total
