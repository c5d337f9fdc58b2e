"""Text-format primitives: escaping, label joining, sample lines, HELP/TYPE headers."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from exporter.runtime.ratelimit import RateLimited

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REPLACEMENT = "\ufffd"
"""What stands for a code point UTF-8 cannot encode (U+FFFD, the replacement character)."""

log = logging.getLogger(__name__)
_SURROGATES = re.compile("[\ud800-\udfff]")
_replaced = RateLimited(60.0)


# The exporter's own families (gpu_exporter_*) name a device's identity in snake_case, as
# Prometheus asks; the DCGM series keep dcgm-exporter's names (UUID, modelName, ...).
OWN_LABELS = {
    "gpu": "gpu",
    "UUID": "uuid",
    "uuid": "uuid",  # -o (dcgm-exporter 1.x names)
    "pci_bus_id": "pci_bus_id",
    "device": "device",
    "modelName": "model_name",
    "Hostname": "hostname",
    "hostname": "hostname",
    "GPU_I_PROFILE": "gpu_i_profile",
    "GPU_I_ID": "gpu_i_id",
    "GPU_CI_ID": "gpu_ci_id",
}


# -o (--use-old-namespace): the DCGM series' labels under dcgm-exporter's 1.x names; metric
# names stay as the metrics file writes them (dcgm-exporter's gpu_collector.go, kubernetes.go)
OLD_LABELS = {
    "UUID": "uuid",
    "pod": "pod_name",
    "namespace": "pod_namespace",
    "container": "container_name",
}
POD_LABELS = ("pod", "namespace", "container")  # a holder's, in dcgm-exporter's order


def renamed(pairs: Iterable[tuple[str, str]], names: Mapping[str, str]) -> list[tuple[str, str]]:
    """``pairs`` with each label name found in ``names`` replaced by its value there."""
    return [(names.get(k, k), v) for k, v in pairs]


def own_labels(
    pairs: Iterable[tuple[str, str]], leave_out: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """A device's identity label pairs under our own families' names (label fields and
    names outside :data:`OWN_LABELS` left out, and those of ``leave_out``)."""
    return [(OWN_LABELS[k], v) for k, v in pairs if k in OWN_LABELS and k not in leave_out]


def valid(value: str) -> str:
    """``value`` with every code point UTF-8 cannot encode replaced by U+FFFD: the lone
    surrogates a JSON string such as ``"\\ud800"`` decodes to (in a Python string every
    surrogate is one). So no string from the kubelet, the API server or NVML can make
    encoding the exposition fail. Logged at most once a minute."""
    if value.isascii():
        return value
    fixed = _SURROGATES.sub(REPLACEMENT, value)
    if fixed != value:
        _replaced.log(
            log,
            logging.WARNING,
            "a label value or help text held code points UTF-8 cannot encode (lone "
            "surrogates, from a hostile or broken peer): each is exported as U+FFFD",
        )
    return fixed


def escape(value: str) -> str:
    """Escape a label value: backslash, double quote and newline (and :func:`valid`)."""
    return valid(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Escape a HELP text: backslash and newline (and :func:`valid`)."""
    return valid(text).replace("\\", "\\\\").replace("\n", "\\n")


def join(pairs: Iterable[tuple[str, str]]) -> str:
    """Label text (without braces) of (name, value) pairs, values escaped."""
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def head(name: str, help_text: str, kind: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family."""
    return f"# HELP {name} {escape_help(help_text)}\n# TYPE {name} {kind}\n"


def num(value: float) -> str:
    """A sample value: ints as written, floats in Python's shortest round-trip form."""
    return str(value) if isinstance(value, int) else repr(float(value))


def sample(name: str, labels: str, value: str) -> str:
    """One sample line from pre-joined label text and a formatted value."""
    return f"{name}{{{labels}}} {value}\n"


def family(name: str, help_text: str, kind: str, lines: list[str]) -> str:
    """A whole family, or nothing when it has no samples."""
    return head(name, help_text, kind) + "".join(lines) if lines else ""
