"""python3 -m tools.devicecheck [--out DIR] [--simulate [FLEET]] [--skew METHOD:DELTA] ...

On a node with the NVIDIA driver: runs the exporter's collector against the real
libnvidia-ml and compares every exported field nvidia-smi can show, at the same
instants; writes the field-support matrix, the cost of each NVML call, the exporter's
CPU per cycle and RSS at a 1 s interval (next to the simulator's), and the answers to
the NVML review's questions, to DIR/report.md and DIR/report.json. Without a driver the
same runs on the simulator, with an nvidia-smi stand-in reading its true state.

Exit status: 0 every field agrees, 1 a mismatch, 2 the check could not run, 130
interrupted (the report so far is written). Nothing on the GPUs is changed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from exporter.sim import FLEETS_DIR
from tools.devicecheck import docmatrix, phases, report
from tools.devicecheck.node import Unusable, describe, open_node
from tools.devicecheck.nvsmi import SmiError
from tools.devicecheck.simsmi import SKEWABLE, skewed

SKEW_ENV = "GPU_EXPORTER_DEVICE_SKEW"


def _skew(text: str) -> tuple[str, float]:
    name, _, delta = text.partition(":")
    if name not in SKEWABLE or not delta:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use METHOD:DELTA, METHOD one of {', '.join(SKEWABLE)}"
        )
    try:
        return name, float(delta)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: DELTA must be a number") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m tools.devicecheck", description=__doc__.split("\n\n")[1]
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("device-report"),
        help="report directory (default ./device-report)",
    )
    p.add_argument("--cycles", type=int, default=5, help="collection cycles compared (default 5)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between cycles (default 1)")
    p.add_argument("--calls", type=int, default=300, help="timings per NVML function (default 300)")
    p.add_argument(
        "--timeout", type=float, default=20.0, help="seconds nvidia-smi may take (default 20)"
    )
    p.add_argument("--process-seconds", type=float, default=10.0, help="window of the CPU/RSS runs")
    p.add_argument(
        "--no-process", action="store_true", help="skip the CPU/RSS runs of the exporter process"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--simulate",
        nargs="?",
        const=FLEETS_DIR / "default.yaml",
        type=Path,
        metavar="FLEET",
        help="run on the simulator even if a driver is here (default fleet: default.yaml)",
    )
    where.add_argument(
        "--real", action="store_true", help="fail instead of falling back to the simulator"
    )
    p.add_argument(
        "--matrix-doc",
        action="store_true",
        help="rewrite the field-support matrix of docs/compatibility.md from the shipped fleets",
    )
    p.add_argument(
        "--check", action="store_true", help="with --matrix-doc: exit 1 if it is out of date"
    )
    p.add_argument(
        "--skew",
        type=_skew,
        action="append",
        default=[],
        metavar="METHOD:DELTA",
        help=f"simulator only: add DELTA to a simulated GPU's METHOD ({', '.join(SKEWABLE)})"
        f" where NVML reads it, not where the stand-in does; also ${SKEW_ENV}",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(args_in)
    if args.matrix_doc:
        return docmatrix.main(args.check)
    env = os.environ.get(SKEW_ENV, "")
    skews = [*args.skew, *(_skew(s) for s in env.split(",") if s.strip())]
    started = time.monotonic()
    res: dict[str, Any] = {"complete": False, "phase": "start"}
    res["about"] = {
        "command": shlex.join(["python3", "-m", "tools.devicecheck", *args_in]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }

    def save(phase: str) -> None:
        res["phase"] = phase
        res["about"]["duration_s"] = round(time.monotonic() - started, 1)
        report.write(args.out, res)

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    code = 2
    node = None
    try:
        node = open_node(args.simulate, args.real, args.timeout)
        res["simulated"] = node.simulated
        if skews and not node.simulated:
            raise Unusable("--skew changes the simulator; this node has a real driver")
        res["about"].update(describe(node))
        if skews:
            res["about"]["skew"] = ", ".join(f"{n}{d:+g}" for n, d in skews)
        with skewed(skews):
            phases.run(node, args, res, save)
        res["complete"] = True
        code = 1 if report.failures(res) else 0
    except KeyboardInterrupt:
        code = 130
    except (Unusable, SmiError) as e:
        res["error"] = str(e)
    except Exception as e:
        res["error"] = f"the check failed in phase {res['phase']}: {type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
        traceback.print_exc()
    finally:
        if node is not None:
            node.close()
        save(res["phase"] if not res["complete"] else "done")
    _summary(res, args.out, code)
    return code


def _summary(res: dict[str, Any], out: Path, code: int) -> None:
    bad = report.failures(res)
    word = {0: "PASS", 1: "FAIL", 2: "COULD NOT RUN", 130: "INTERRUPTED"}[code]
    print(f"device check: {word}: {len(bad)} mismatch(es); report in {out}/report.md")
    if res.get("error"):
        print(f"  {res['error']}", file=sys.stderr)
    if bad:
        heads = (
            "cycle",
            "GPU",
            "field",
            "nvidia-smi",
            "before",
            "exporter",
            "after",
            "tolerance",
            "verdict",
        )
        keys = (
            "cycle",
            "gpu",
            "field",
            "nvidia_smi",
            "before",
            "exporter",
            "after",
            "tolerance",
            "verdict",
        )
        rows = [heads, *([str(r[k]) for k in keys] for r in bad[:30])]
        widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if len(bad) > 30:
            print(f"... {len(bad) - 30} more in {out}/report.md")


if __name__ == "__main__":
    sys.exit(main())
