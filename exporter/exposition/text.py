"""Text-format primitives: escaping, label joining, sample lines, HELP/TYPE headers."""

from __future__ import annotations

from collections.abc import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape(value: str) -> str:
    """Escape a label value: backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Escape a HELP text: backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


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
