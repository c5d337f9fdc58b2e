"""Checked reading of fleet files: every error names the file and the path inside it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn


class FleetError(ValueError):
    """A fleet file (or fault) that cannot be simulated; the message says where and what to do."""


def join(path: str, key: str | int) -> str:
    """`gpus` + 2 -> `gpus[2]`; `gpus[2]` + `mig` -> `gpus[2].mig`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


class Reader:
    """Type-checked access to parsed YAML, failing with FleetError('<source>: <path>: ...')."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> NoReturn:
        where = f"{self.source}: {path}" if path else self.source
        raise FleetError(f"{where}: {message}")

    def mapping(
        self, value: Any, path: str, keys: Iterable[str], required: Iterable[str] = ()
    ) -> dict[str, Any]:
        keys = tuple(keys)
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_kind(value)}")
        for key in value:
            if key not in keys:
                self.fail(join(path, str(key)), f"unknown key; known keys: {', '.join(keys)}")
        for key in required:
            if key not in value:
                self.fail(path, f"missing required key '{key}'")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_kind(value)}")
        return value

    def string(self, value: Any, path: str) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.fail(path, f"expected a string, got {_kind(value)}")
        return str(value)

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_kind(value)}")
        return value

    def integer(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_kind(value)} ({value!r})")
        self._bounds(value, path, lo, hi)
        return value

    def number(
        self, value: Any, path: str, lo: float | None = None, hi: float | None = None
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected a number, got {_kind(value)} ({value!r})")
        self._bounds(value, path, lo, hi)
        return float(value)

    def _bounds(self, value: float, path: str, lo: float | None, hi: float | None) -> None:
        if lo is not None and value < lo:
            self.fail(path, f"{value} is below the minimum {lo}")
        if hi is not None and value > hi:
            self.fail(path, f"{value} is above the maximum {hi}")
