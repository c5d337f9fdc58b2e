"""No test leaves an exporter process behind.

A test that ends with an exporter it started still running (one registered by
tests/procs.py, or any child of pytest running ``-m exporter``) fails, and the
process is killed. Exporters that module fixtures start are checked when the
module's fixtures are torn down.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest

from tests import procs


def _children() -> dict[int, str]:
    """pid -> command line of this process's living children that run the exporter."""
    me = os.getpid()
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) != me or state == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if _is_exporter(argv):
            out[int(entry)] = " ".join(a.decode(errors="replace") for a in argv if a)
    return out


def _is_exporter(argv: list[bytes]) -> bool:
    """``python -m exporter ...`` or ``gpu-exporter ...``."""
    pairs = itertools.pairwise(argv)
    return any(a == b"-m" and b == b"exporter" for a, b in pairs) or (
        bool(argv) and os.path.basename(argv[0]) == b"gpu-exporter"
    )


def _running(known: set[int], registered: int) -> list[str]:
    """Kill the exporters started since ``known``/``registered`` that still run; their
    command lines."""
    left: list[str] = []
    for proc in procs.STARTED[registered:]:
        if proc.poll() is None:
            left.append(" ".join(map(str, proc.args)))  # type: ignore[arg-type]
            proc.kill()
            proc.wait(5)
    for pid, cmd in _children().items():
        if pid in known:
            continue
        left.append(cmd)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    del procs.STARTED[registered:]
    return left


def _guard() -> Iterator[None]:
    known, registered = set(_children()), len(procs.STARTED)
    yield
    left = _running(known, registered)
    if left:
        pytest.fail(f"exporter process(es) left running, now killed: {left}", pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def no_exporter_left_by_module() -> Iterator[None]:
    """Fail the module whose fixtures leave an exporter running."""
    yield from _guard()


@pytest.fixture(autouse=True)
def no_exporter_left_by_test() -> Iterator[None]:
    """Fail the test that leaves an exporter running (set up before, torn down after,
    the test's own function-scoped fixtures)."""
    yield from _guard()
