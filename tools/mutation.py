"""Mutation run over the core modules: do their tests fail when the code is wrong?

    python3 -m tools.mutation                 # every module of tests/mutation-targets.csv
    python3 -m tools.mutation MODULE ...      # some of them (paths as in the table)

For each module, mutmut (2.5.1, from PyPI) mutates it in a copy of the working tree (the
files git tracks or would track, edits included), running only that module's test files
from the table once per mutant. A mutant is killed when its tests fail (exit status other
than 0), time out or take over 4 GiB (MemoryError). Prints killed/total per module and
each survivor's diff that the module's survivors file does not name; exits 1 when a module
has under 90 % killed or an unnamed survivor, 2 on a bad argument or a missing tool.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
TABLE = ROOT / "tests" / "mutation-targets.csv"
MIN_KILLED = 0.90  # the share of a module's mutants its tests must kill
# the first cell of a survivors file's table rows: mutant numbers, "7" or "28, 29"
# mutmut's statuses of a tested mutant -> killed: failed, timed out, failed but slowly
# ("suspicious"); survived: passed
DONE = {"ok_killed": True, "bad_timeout": True, "ok_suspicious": True, "bad_survived": False}
WATCH_S = 10.0  # seconds between looks at whether mutmut's worker is alive
RESTARTS = 10
MEMORY = 4 << 30  # bytes of address space a run of the tests may take
# pytest in mutmut's own child, so that killing it at the timeout (a mutant that loops for
# ever) ends the tests: pytest under ``sh -c`` lived on, holding the output mutmut waits
# on. Any failure exits 1: mutmut 2 counts only 1 as one (pytest exits 2 when a mutant
# breaks the import), and a run the kernel kills for memory as passing, so a mutant that
# eats memory gets MemoryError at MEMORY instead, and the machine keeps the rest.
RUNNER = (
    sys.executable, "-c",
    "import resource, sys, pytest; resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2);"
    " sys.exit(pytest.main(sys.argv[2:]) and 1)",
    str(MEMORY), "-x", "-q", "-p", "no:cacheprovider",
)  # fmt: skip
NAMED = re.compile(r"^\|\s*(\d+(?:-\d+)?(?:\s*,\s*\d+(?:-\d+)?)*)\s*\|", re.M)


@dataclass(frozen=True)
class Target:
    """One row of the table: a module, the file naming its survivors, its test files."""

    module: str
    survivors: str
    tests: tuple[str, ...]


@dataclass(frozen=True)
class Result:
    """What one module's run found: mutant numbers by outcome, and its seconds."""

    killed: tuple[int, ...]
    survived: tuple[int, ...]
    seconds: float
    untested: tuple[int, ...] = ()  # records mutmut left untested (see run)

    @property
    def total(self) -> int:
        return len(self.killed) + len(self.survived)


def targets(path: Path = TABLE) -> dict[str, Target]:
    """The table's rows by module path."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        r["module"]: Target(r["module"], r["survivors"], tuple(r["tests"].split())) for r in rows
    }


def named(survivors: Path) -> set[int]:
    """The mutant numbers a survivors file names in its table rows' first cells (``7, 8,
    11-26``); none while it does not exist."""
    if not survivors.is_file():
        return set()
    out: set[int] = set()
    for cell in NAMED.findall(survivors.read_text()):
        for item in cell.split(","):
            first, _, last = item.strip().partition("-")  # "11-26": 11 to 26
            out.update(range(int(first), int(last or first) + 1))
    return out


def _copy(dest: Path) -> None:
    """The working tree's files that git tracks or would track, into ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, listed):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # a deleted file stays listed until committed
            out = dest / os.fsdecode(name)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def _mutmut(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(copy))
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=copy, env=env, capture_output=True, text=True
    )


def _statuses(copy: Path) -> list[tuple[int, str]]:
    """(mutmut's id, status) of each mutant in source order (line, then mutation on it):
    the n-th is mutant n of a fresh run, whatever order a resumed one stored them in."""
    with contextlib.closing(sqlite3.connect(copy / ".mutmut-cache")) as db:
        rows = db.execute(
            "SELECT m.id, m.status FROM Mutant m JOIN Line l ON m.line = l.id"
            ' ORDER BY l.line_number, m."index"'
        )
        return [(int(i), str(status)) for i, status in rows]


def _working(pid: int) -> list[int]:
    """The processes ``pid`` started that test (the baseline's runner, the worker that
    tests mutants), not multiprocessing's resource tracker."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == pid and b"resource_tracker" not in cmd:
                out.append(int(stat.parent.name))
    return out


def _run_mutmut(copy: Path, module: str, args: tuple[str, ...]) -> str:
    """``mutmut run`` until it has tested every mutant; its output. A worker that
    died leaves mutmut waiting for ever: it is stopped, the module restored from
    mutmut's backup, and the run resumed (mutmut keeps what it tested)."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    log = copy / ".mutmut-run.log"
    for _ in range(RESTARTS):
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mutmut", "run", "--no-progress", *args],
                cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            idle = 0
            while proc.poll() is None:
                time.sleep(WATCH_S)
                idle = 0 if _working(proc.pid) else idle + 1
                if idle >= 3:  # no worker for three looks in a row: it died
                    proc.kill()
                    proc.wait()
        if proc.returncode is not None and idle < 3:
            return log.read_text()
        backup = copy / f"{module}.bak"
        if backup.is_file():
            backup.replace(copy / module)
    raise RuntimeError(f"mutmut's worker died {RESTARTS} times:\n{log.read_text()}")


def run(target: Target, keep: Path | None = None) -> tuple[Result, dict[int, str]]:
    """Mutate ``target.module`` in a fresh copy; the result and each survivor's diff."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy = keep or Path(tmp)
        _copy(copy)
        t0 = time.monotonic()
        runner = shlex.join([*RUNNER, *target.tests])
        args = ("--paths-to-mutate", target.module, "--runner", runner)
        log = _run_mutmut(copy, target.module, args)
        seconds = time.monotonic() - t0
        stored = _statuses(copy) if (copy / ".mutmut-cache").is_file() else []
        if not stored:
            raise RuntimeError(f"mutmut tested no mutant of {target.module}:\n{log}")
        # mutmut 2 files a mutant of a line that repeats an earlier one (``out = {}``)
        # under the earlier line's record too: the repeat's own record stays untested
        untested = [n for n, (_, status) in enumerate(stored, 1) if status not in DONE]
        killed = [n for n, (_, status) in enumerate(stored, 1) if DONE.get(status)]
        survived = [n for n, (_, status) in enumerate(stored, 1) if DONE.get(status) is False]
        diffs = {n: _mutmut(copy, "show", str(stored[n - 1][0])).stdout for n in survived}
    return Result(tuple(killed), tuple(survived), seconds, tuple(untested)), diffs


def report(target: Target, result: Result, diffs: dict[int, str]) -> bool:
    """Print one module's line (and unnamed survivors' diffs); whether it passes."""
    unnamed = sorted(set(result.survived) - named(ROOT / target.survivors))
    share = len(result.killed) / result.total
    print(
        f"{target.module}: {len(result.killed)}/{result.total} killed ({share:.0%}), "
        f"{len(result.survived)} survive, {len(unnamed)} not named in {target.survivors}, "
        f"{len(result.untested)} records untested; "
        f"{result.seconds:.0f} s",
        flush=True,
    )
    for n in unnamed:
        print(f"  survivor {n}:\n{diffs[n]}")
    return share >= MIN_KILLED and not unnamed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.mutation", description=__doc__)
    parser.add_argument("modules", nargs="*", help="module paths from the table (default: all)")
    parser.add_argument(
        "--keep", type=Path, help="an empty folder to keep the copy in (one module)"
    )
    args = parser.parse_args(argv)
    table = targets()
    wrong = [m for m in args.modules if m not in table]
    if wrong:
        parser.error(f"not in {TABLE.relative_to(ROOT)}: {', '.join(wrong)}")
    if args.keep is not None and len(args.modules) != 1:
        parser.error("--keep takes exactly one module")
    if importlib.util.find_spec("mutmut") is None:
        parser.error("mutmut is not installed: pip install mutmut==2.5.1")
    ok = True
    for module in args.modules or list(table):
        ok = report(table[module], *run(table[module], args.keep)) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
