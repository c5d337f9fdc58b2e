"""Bounded reading of the exporter's config files (web config, metrics file, fleet file).

Only regular files are read, and only up to a size: a FIFO, a device such as /dev/zero
or a socket is refused at once, without blocking, so a reload or a SIGTERM never waits
on it. YAML is loaded without anchors and aliases, so a small file cannot expand into
gigabytes ("billion laughs"). Errors name the file and what to do, never its content.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

MAX_CONFIG_BYTES = 1 << 20
"""Default size bound for a config file, bytes (1 MiB)."""


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names it and says what to do."""


def read_config_file(path: str, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``max_bytes`` bytes.

    ``what`` names the file in errors (e.g. "web config"). Raises ConfigFileError.
    """
    try:
        return read_config_bytes(path, what, max_bytes).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(f"{what} {path}: not UTF-8 text; save it as UTF-8") from None


def read_config_bytes(
    path: str, what: str, max_bytes: int = MAX_CONFIG_BYTES, follow_links: bool = True
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` bytes (see above);
    with ``follow_links`` False, a symbolic link at ``path`` is refused too."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)  # non-blocking: opening a FIFO must not wait for a writer
    except OSError as e:
        raise ConfigFileError(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigFileError(
                f"{what} {path}: not a regular file ({_kind(mode)}); give the path of a file"
            )
        chunks, size = [], 0
        while chunk := os.read(fd, min(65536, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ConfigFileError(
                    f"{what} {path}: larger than {_size(max_bytes)}; is it the right file?"
                )
    except OSError as e:
        raise ConfigFileError(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases (config files need neither)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent) or anchor is not None:
            mark = event.start_mark
            raise yaml.composer.ComposerError(
                None, None, "YAML anchors and aliases (& and *) are not accepted", mark
            )
        return super().compose_node(parent, index)


MAX_INT_DIGITS = 30  # a YAML integer longer than this is refused, not handed to int()


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    """YAML's int, refused past MAX_INT_DIGITS characters: a 5,000-digit one would fail
    int()'s digit limit with a ValueError no caller expects (and cost time below it)."""
    if len(node.value) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"a number of more than {MAX_INT_DIGITS} digits", node.start_mark
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_NoAliasLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


class _UniqueKeyLoader(_NoAliasLoader):
    """Also refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {str(key)[:60]!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str, what: str, unique_keys: bool = False) -> Any:
    """Parse YAML ``text`` safely, refusing anchors/aliases; raises ConfigFileError.

    ``unique_keys``: a key given twice in one mapping is an error too. The error says
    what is wrong and where (line, column), never quoting the text: a config file may
    hold secrets, and this goes to the log.
    """
    loader = None
    try:
        loader = (_UniqueKeyLoader if unique_keys else _NoAliasLoader)(text)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigFileError(f"{what}: not valid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise ConfigFileError(f"{what}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong and where, without PyYAML's snippet of the file."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(e, 'problem', None) or type(e).__name__}{where}"


def _size(n: int) -> str:
    """1048576 -> "1 MiB"; sizes that are not whole KiB or MiB in bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"
