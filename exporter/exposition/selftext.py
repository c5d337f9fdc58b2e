"""Gauge and counter families in the Prometheus text format, and the process metrics.

What the exporter reports about itself (selfmetrics.py) is a few dozen gauges and
counters; this module writes them without prometheus-client, byte for byte as its
``generate_latest`` does (labels sorted by name, values as Go writes floats), and reads
the standard ``process_*`` metrics from /proc the way its ProcessCollector does on Linux.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from exporter.exposition.text import escape, head

PROC_READ_BYTES = 64 * 1024  # bound on one read of /proc/self/{stat,limits}; both are < 2 KiB


class Family:
    """One metric family: ``kind`` is "gauge" or "counter" (samples named ``name_total``).

    ``labels`` are the label names; each sample is (label values in that order, value).
    """

    __slots__ = ("help", "kind", "labels", "name", "samples")

    def __init__(
        self,
        name: str,
        help_text: str,
        value: float | None = None,
        labels: Sequence[str] = (),
        kind: str = "gauge",
    ) -> None:
        self.name = name
        self.help = help_text
        self.kind = kind
        self.labels = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        if value is not None:
            self.samples.append(((), value))

    def add(self, values: Sequence[str], value: float) -> None:
        """One sample: label values in the order of ``labels``."""
        self.samples.append((tuple(values), value))


def counter(
    name: str, help_text: str, value: float | None = None, labels: Sequence[str] = ()
) -> Family:
    """A counter family (name without ``_total``)."""
    return Family(name, help_text, value, labels, kind="counter")


def go_float(value: float) -> str:
    """A sample value as prometheus-client writes it: Go's float formatting where it differs
    from Python's repr (+Inf, -Inf, NaN, and an exponent from 1e+06 up)."""
    v = float(value)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    text = repr(v)
    point = text.find(".")
    if v <= 0 or point <= 6:
        return text
    # seven or more digits before the point: d[.ddd]e+NN, trailing zeros dropped
    digits = (text[:point] + text[point + 1 :]).rstrip("0")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e+{point - 1:02d}"


def text(families: Iterable[Family]) -> str:
    """The families in the Prometheus text format (version 0.0.4), as ``generate_latest``
    writes them."""
    out: list[str] = []
    for f in families:
        name = f.name + "_total" if f.kind == "counter" else f.name
        out.append(head(name, f.help, f.kind))
        order = sorted(range(len(f.labels)), key=f.labels.__getitem__)
        for values, value in f.samples:
            if not values:
                out.append(f"{name} {go_float(value)}\n")
                continue
            pairs = ",".join(f'{f.labels[i]}="{escape(values[i])}"' for i in order)
            out.append(f"{name}{{{pairs}}} {go_float(value)}\n")
    return "".join(out)


class Texts:
    """:func:`text` that keeps each family's text from the last call: a family whose
    name, help, kind, labels and samples are all as they were is not written again."""

    def __init__(self) -> None:
        self._last: dict[tuple[object, ...], str] = {}

    def __call__(self, families: Iterable[Family]) -> str:
        last, now = self._last, {}
        out: list[str] = []
        for f in families:
            key = _key(f)
            got = last.get(key)
            if got is None:
                got = text((f,))
            now[key] = got
            out.append(got)
        self._last = now  # only this call's families: bounded by what is rendered
        return "".join(out)


def _key(f: Family) -> tuple[object, ...]:
    """What a family's text is written from. Equal numbers are written alike (go_float
    writes float(value)) except the zeros 0.0 and -0.0: zeros go in as their text."""
    samples = tuple((v, x) if x else (v, repr(float(x))) for v, x in f.samples)
    return (f.name, f.help, f.kind, f.labels, samples)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(PROC_READ_BYTES)


class ProcessMetrics:
    """The ``process_*`` metrics of this process from /proc (Linux): memory, CPU seconds,
    start time, file descriptors. A file that cannot be read leaves its metrics out; without
    the boot time in /proc/stat there are none."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.ticks = _sysconf("SC_CLK_TCK", 100)  # clock ticks per second
        self.page_size = _sysconf("SC_PAGE_SIZE", 4096)  # bytes
        self.boot_time = 0.0  # unix seconds
        try:
            for line in _read(os.path.join(proc, "stat")).splitlines():
                if line.startswith(b"btime "):
                    self.boot_time = float(line.split()[1])
                    break
        except (OSError, ValueError, IndexError):
            pass

    def families(self) -> list[Family]:
        """The families for this process now, in prometheus-client's order."""
        if not self.boot_time:
            return []
        me = os.path.join(self.proc, "self")
        out: list[Family] = []
        try:
            f = _read(os.path.join(me, "stat")).split(b")")[-1].split()
            out += [
                Family(
                    "process_virtual_memory_bytes", "Virtual memory size in bytes.", float(f[20])
                ),
                Family(
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    float(f[21]) * self.page_size,
                ),
                Family(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    float(f[19]) / self.ticks + self.boot_time,
                ),
                counter(
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds.",
                    float(f[11]) / self.ticks + float(f[12]) / self.ticks,
                ),
            ]
        except (OSError, ValueError, IndexError):
            pass
        try:
            fds = len(os.listdir(os.path.join(me, "fd")))
            out.append(Family("process_open_fds", "Number of open file descriptors.", fds))
        except OSError:
            pass
        try:
            for line in _read(os.path.join(me, "limits")).splitlines():
                if line.startswith(b"Max open file"):
                    limit = float(line.split()[3])  # the soft limit
                    doc = "Maximum number of open file descriptors."
                    out.append(Family("process_max_fds", doc, limit))
                    break
        except (OSError, ValueError, IndexError):
            pass
        return out


def _sysconf(name: str, default: int) -> int:
    try:
        return os.sysconf(name)
    except (ValueError, OSError, AttributeError):
        return default
