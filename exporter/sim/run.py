"""Run any pynvml program against the simulated driver.

    python -m exporter.sim.run [--fleet FILE] [--no-latency] -- TARGET [ARGS...]

TARGET is `-m module`, a Python file, or a console script name (for example
nvitop-exporter or gpu-exporter), looked up through its entry point.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from exporter.sim import FleetError, install


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m exporter.sim.run",
        description="Run a pynvml-based program against the simulated NVML driver.",
    )
    p.add_argument("--fleet", help="fleet YAML file (default: exporter/sim/fleets/default.yaml)")
    p.add_argument("--no-latency", action="store_true", help="turn the per-call cost model off")
    p.add_argument(
        "target", nargs=argparse.REMAINDER, help="-m MODULE | FILE.py | SCRIPT, then its arguments"
    )
    return p


def _entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    for ep in importlib.metadata.entry_points(group="console_scripts"):
        if ep.name == name:
            return ep
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    target = list(args.target)
    if target and target[0] == "--":
        target = target[1:]
    if not target:
        _parser().error("no target: give -m MODULE, a Python file, or a console script")
    try:
        install(args.fleet, latency=False if args.no_latency else None)
    except FleetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if target[0] == "-m":
        if len(target) < 2:
            _parser().error("-m needs a module name")
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        return 0
    if target[0].endswith(".py") or Path(target[0]).is_file():
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")
        return 0
    ep = _entry_point(target[0])
    if ep is None:
        print(
            f"error: '{target[0]}' is not a module (-m), a file, or a console script",
            file=sys.stderr,
        )
        return 2
    sys.argv = list(target)
    result = ep.load()()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
