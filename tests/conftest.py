"""Test-suite policy: slow tests are marked, and no test leaves an exporter behind.

Marks the slow tests, so that ``python3 -m pytest -m "not slow"`` is a quick check.

Slow means: starts the exporter, Prometheus or Alertmanager as a process, builds
the image, renders the manifests (kubectl kustomize), soaks, fuzzes, or attacks and
faults a running exporter. The full suite, ``python3 -m pytest -q``, still runs every test.

Two marks divide part of the slow tests further: ``e2e`` (starts the exporter,
Prometheus or Alertmanager as a process) and ``soak`` (the soaks, minutes each).
Every e2e and soak test is also slow.

No test leaves an exporter process behind.

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
from pathlib import Path

import pytest

from tests import procs

ROOT = Path(__file__).parent.parent

# Test ids (relative to the repository root) starting with one of these are slow;
# so is every test in a file named *_e2e.py.
SLOW = (
    "tests/e2e/",  # the exporter as a subprocess: scraped by Prometheus, its CLI, TLS, kube
    "tests/reliability/",  # attacks, faults, hangs, signals and the soak
    "tests/fuzz/",  # hypothesis searches
    "tests/benchmarks/test_benchmarks.py",  # runs the benchmark suite's quick mode
    "tests/benchmarks/test_device.py",  # the device check on the simulator
    "tests/deploy/",  # kubectl kustomize on every overlay, the image build, a real Prometheus
    "tests/alerts/test_alert_rules.py::test_promtool_unit_tests_pass",
    "tests/alerts/test_alertmanager_config.py::test_inhibitions_in_a_real_alertmanager",
    "tests/alerts/test_alertmanager_config.py::test_every_alert_rule_reaches_its_receiver",
    "tests/workloads/apiserver/test_watch_hostile.py",  # 100,000-pod lists and watches
)

# Slow tests that start the exporter, Prometheus or Alertmanager as a process (so does
# every test in a file named *_e2e.py), less the soaks.
E2E = (
    "tests/e2e/",
    "tests/reliability/",
    "tests/deploy/test_annotation_scrape.py",  # a real Prometheus
    "tests/deploy/test_image.py",  # the exporter in its image
    "tests/alerts/test_alertmanager_config.py::test_inhibitions_in_a_real_alertmanager",
    "tests/alerts/test_alertmanager_config.py::test_every_alert_rule_reaches_its_receiver",
)

# The soaks: minutes each.
SOAK = (
    "tests/reliability/test_soak.py",
    "tests/reliability/test_attack_soak.py",
)


@pytest.fixture(autouse=True)
def _short_event_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process collectors wait 50 ms per nvmlEventSetWait_v2 call instead of 1 s.

    Closing a collector joins its XID event thread, which returns within one wait:
    this keeps each close near 0.05 s. Exporters started as processes are unchanged.
    """
    from exporter.nvml.xid import events

    monkeypatch.setattr(events, "WAIT_MS", 50)


def _e2e_file(nodeid: str) -> bool:
    return nodeid.split("::")[0].endswith("_e2e.py")


def _marks(nodeid: str) -> list[str]:
    """The marks a test gets by its id: slow, e2e, soak."""
    soak = nodeid.startswith(SOAK)
    e2e = not soak and (nodeid.startswith(E2E) or _e2e_file(nodeid))
    slow = nodeid.startswith(SLOW) or _e2e_file(nodeid)
    return [m for m, on in (("slow", slow), ("e2e", e2e), ("soak", soak)) if on]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "not slow"``, files that hold only slow tests are not even imported."""
    if " ".join(config.option.markexpr.split()) != "not slow":
        return None
    try:
        rel = collection_path.relative_to(ROOT).as_posix()
    except ValueError:
        return None
    whole = [s for s in SLOW if "::" not in s]
    if any(rel == s.rstrip("/") or rel.startswith(s) for s in whole) or rel.endswith("_e2e.py"):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in _marks(item.nodeid):
            item.add_marker(getattr(pytest.mark, mark))


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
