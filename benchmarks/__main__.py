"""python -m benchmarks [--quick] [--no-peer | --peer] [--out FILE] [--json FILE] [--from-json FILE]

Runs the benchmark suite on the simulated NVML driver and writes
docs/benchmarks.md (machine, command, numbers, targets). See that file. A --quick
run (tiny sizes, for tests) writes a report only where --out says.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report, suite
from benchmarks.procs import ROOT


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark gpu-exporter on the simulated NVML driver and write the results.",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds (for tests)")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--no-peer", action="store_true", help="leave nvitop-exporter out")
    peer.add_argument(
        "--peer", action="store_true", help="include nvitop-exporter in --quick (full runs do)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="report to write (its other sections are kept); default docs/benchmarks.md, "
        "none with --quick, whose tiny sizes are no numbers to publish",
    )
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: rewrite the report from FILE",
    )
    args = p.parse_args(args_in)
    if args.out is None and (not args.quick or args.from_json):
        args.out = ROOT / "docs" / "benchmarks.md"
    if args.from_json:
        res = json.loads(args.from_json.read_text())
        report.write(args.out, report.generated(res, res["command"]))
        print(f"wrote {args.out} from {args.from_json}")
        return 0

    with_peer = not args.no_peer and (args.peer or not args.quick)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-bench-") as tmp:

        def log(msg: str) -> None:
            print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

        res = suite.run(args.quick, with_peer, Path(tmp), log)
    command = shlex.join(["python", "-m", "benchmarks", *args_in])
    res["command"] = command
    if args.out is not None:
        report.write(args.out, report.generated(res, command))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    d = report.derived(res)
    for name, measured, ok in report.targets(res, d):
        print(f"{report._verdict(ok).strip('*'):8s} {name}: {measured}")
    print(f"wrote {args.out}" if args.out else "no report written (--quick without --out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
