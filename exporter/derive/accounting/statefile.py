"""The accounting state on the node's disk, so that the counters survive a restart.

``--accounting-state-dir`` names a directory (the DaemonSet and the chart mount a
hostPath there); the derive stage writes ``accounting-state.json`` in it every
``SAVE_EVERY_S`` seconds of the collector's clock and when the exporter stops (SIGTERM),
atomically: a temporary file in the same directory, flushed to disk, then renamed over
the old one. The next process restores it at its first cycle when the node's boot ID,
the driver version and the set of GPU UUIDs are those the file was written with, and
ignores it with one log line otherwise (a reboot, a driver upgrade, a GPU swapped: the
counters then start from 0, which Prometheus's ``increase()`` takes as a reset).

A file that is not there is a first start. One that cannot be read, is larger than
``MAX_BYTES``, is not JSON, or holds anything but the expected shape (types, sizes,
finite non-negative numbers) is one log line and a fresh start, never a crash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from exporter.config.files import ConfigFileError, read_config_bytes

log = logging.getLogger(__name__)

NAME = "accounting-state.json"
VERSION = 1
MAX_BYTES = 16 * 1024 * 1024
"""Largest state file read: 8,192 holders at well under 1 KiB each, with room."""
SAVE_EVERY_S = 30.0
"""Seconds of the collector's clock between two writes (and one at SIGTERM)."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_ITEMS = 65_536  # entries of any list in the file
MAX_TEXT = 1024  # characters of any string in the file

Identity = tuple[str, str, tuple[str, ...]]
"""(boot ID, driver version, sorted GPU UUIDs): what a state file must match."""


class Unusable(Exception):
    """The state file's content is not a state this version wrote."""


def boot_id(path: str = BOOT_ID) -> str:
    """The kernel's boot ID ("" when it cannot be read: then no file ever matches)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return ""


class StateFile:
    """Reads and writes the state in ``directory``."""

    def __init__(self, directory: str, boot_id_path: str = BOOT_ID) -> None:
        self.path = Path(directory) / NAME
        self.boot_id_path = boot_id_path
        self._failing = ""  # the last write error logged (logged once until it changes)

    def identity(self, driver: str, uuids: list[str]) -> Identity:
        return (boot_id(self.boot_id_path), driver, tuple(sorted(uuids)))

    def load(self, ident: Identity) -> dict[str, Any] | None:
        """The saved state when it matches ``ident``, else None (logged in one line)."""
        if not os.path.lexists(self.path):
            return None
        try:
            raw = read_config_bytes(str(self.path), "accounting state", MAX_BYTES, False)
        except ConfigFileError as e:  # unreadable, a link, not a regular file, too large
            log.warning("%s; counters start from 0", e)
            return None
        try:
            state = check(json.loads(raw.decode("utf-8")))
        except (ValueError, RecursionError, Unusable) as e:
            log.warning(
                "accounting state %s is unusable (%s); counters start from 0",
                self.path,
                str(e)[:200],
            )
            return None
        saved = (state["boot_id"], state["driver"], tuple(state["gpu_uuids"]))
        if saved != ident or not ident[0]:
            why = (
                "the node rebooted"
                if saved[0] != ident[0] or not ident[0]
                else "the driver changed"
                if saved[1] != ident[1]
                else "the GPUs changed"
            )
            log.warning(
                "accounting state %s ignored: %s since it was written; counters start from 0",
                self.path,
                why,
            )
            return None
        return state

    def save(self, ident: Identity, body: dict[str, Any]) -> bool:
        """Write ``body`` with ``ident`` atomically; False (logged once) when it fails."""
        state = {
            "version": VERSION,
            "boot_id": ident[0],
            "driver": ident[1],
            "gpu_uuids": list(ident[2]),
            **body,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".accounting-state-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(state, f, separators=(",", ":"), allow_nan=False)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except (OSError, ValueError) as e:
            if str(e) != self._failing:
                self._failing = str(e)
                log.warning("accounting state not written to %s: %s", self.path, e)
            return False
        self._failing = ""
        return True


def check(state: Any) -> dict[str, Any]:
    """``state`` when it has the shape this version writes; raises Unusable."""
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise Unusable("not a state file of this version")
    for name in ("boot_id", "driver"):
        text(state.get(name), name)
    for i, u in enumerate(items(state.get("gpu_uuids"), "gpu_uuids")):
        text(u, f"gpu_uuids[{i}]")
    return state


def text(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise Unusable(f"{where} is not a string of at most {MAX_TEXT} characters")
    return value


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unusable(f"{where} is not a number")
    if not math.isfinite(value) or value < 0:
        raise Unusable(f"{where} is not a finite number of at least 0")
    return float(value)


def items(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise Unusable(f"{where} is not a list of at most {MAX_ITEMS} entries")
    return value
