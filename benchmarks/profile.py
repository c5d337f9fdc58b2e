"""Where the CPU goes: py-spy profiles of a collection cycle and of the scrape path.

    python -m benchmarks.profile [--seconds 15] [--quick]     (prints Markdown)

1. Cycles: ``Collector.collect()`` + ``Poller.publish()`` back to back on the
   8x H100 node with 56 MIG instances (sim time moved 1 s per cycle), sampled
   by py-spy at 1 kHz. Each sample is charged to the innermost frame that
   says whose work it is: the latency model's wait (the modelled driver
   cost), the simulator, pynvml, or an exporter function. pynvml's structure
   accessors (``_PrintableStructure``) are charged to whoever touched the
   structure, since a real driver fills structures in C.
2. Scrapes: the exporter process on the same node under 10 concurrent gzip
   scrapers; samples of its event-loop thread split into socket writes,
   aiohttp's request handling and the per-cycle publish work done on the loop.

py-spy comes from PATH, else from benchmarks/.venv-tools (made on first use
with ``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import fleets, procs
from benchmarks.load import scrape_load
from benchmarks.procs import ROOT

TOOLS = ROOT / "benchmarks" / ".venv-tools"


def py_spy() -> str:
    """Path of py-spy, installing it into benchmarks/.venv-tools when missing."""
    import shutil

    found = shutil.which("py-spy") or (TOOLS / "bin" / "py-spy")
    if Path(found).exists():
        return str(found)
    subprocess.run([sys.executable, "-m", "venv", str(TOOLS)], check=True)
    pip = [str(TOOLS / "bin" / "python"), "-m", "pip", "install", "--quiet", "py-spy"]
    subprocess.run(pip, check=True)
    return str(TOOLS / "bin" / "py-spy")


def loop(fleet: str, seconds: float) -> None:
    """The profiled child: collection cycles back to back for `seconds`."""
    from benchmarks.simnode import SimNode

    with SimNode(fleet) as node:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            node.poller.publish(node.cycle())


def _stacks(raw: Path) -> list[tuple[list[str], int]]:
    out = []
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out.append((stack.split(";"), int(n)))
    return out


def _owner(frames: list[str]) -> str:
    for f in reversed(frames):
        if "_PrintableStructure" in f:
            continue
        if "sim/latency.py" in f:
            return "driver calls (modelled busy-wait)"
        if "exporter/sim/" in f:
            return "simulator (not on a real node)"
        if "pynvml.py" in f:
            return "pynvml"
        if "exporter/" in f:
            return "exporter: " + f.split(" (")[0]
        if "gzip.py" in f or "zlib" in f:
            return "gzip"
    return "other"


def cycle_profile(spy: str, fleet: Path, seconds: float, work: Path) -> str:
    raw = work / "cycle.txt"
    child = [sys.executable, "-m", "benchmarks.profile", "--loop", str(fleet), str(seconds)]
    cmd = [spy, "record", "-r", "1000", "-f", "raw", "-o", str(raw), "--", *child]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    owners: collections.Counter[str] = collections.Counter()
    for frames, n in _stacks(raw):
        if any("collect" in f or "publish" in f for f in frames):
            owners[_owner(frames)] += n
    total = sum(owners.values())
    lines = ["| whose work | share of a cycle's CPU samples |", "| --- | --- |"]
    grouped: collections.Counter[str] = collections.Counter()
    for k, n in owners.items():
        grouped["exporter (all functions)" if k.startswith("exporter: ") else k] += n
    for k, n in grouped.most_common():
        lines.append(f"| {k} | {n / total:.1%} |")
    lines += ["", "| exporter function (self) | share |", "| --- | --- |"]
    for k, n in owners.most_common():
        if k.startswith("exporter: ") and n / total >= 0.005:
            lines.append(f"| `{k[len('exporter: ') :]}` | {n / total:.1%} |")
    return "\n".join(lines)


def scrape_profile(spy: str, fleet: Path, seconds: float, work: Path) -> str:
    raw = work / "scrape.txt"
    with procs.ours(fleet, 1000, work / "exporter.log") as p:
        p.wait_http("/ready")
        time.sleep(1.0)
        cmd = [spy, "record", "-r", "1000", "-f", "raw", "-o", str(raw)]
        cmd += ["-p", str(p.pid), "-d", str(int(seconds))]
        rec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        done = threading.Event()

        def load() -> None:
            while not done.is_set():
                scrape_load(p.port, 10, 300, 0.5, True)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        rec.wait()
        done.set()
        t.join()
    parts: collections.Counter[str] = collections.Counter()
    for frames, n in _stacks(raw):
        if not frames or not frames[0].startswith("_run_module_as_main"):
            continue  # only the event-loop (main) thread
        stack = ";".join(frames)
        if "select (selectors.py" in frames[-1]:
            continue  # idle
        if "publish" in stack or "_publish_self" in stack:
            part = "publish on the loop (render, self-metrics, gzip)"
        elif "_SelectorSocketTransport.write" in stack or "transport.write" in stack.lower():
            part = "socket write (kernel: send the body)"
        elif "aiohttp" in stack:
            part = "aiohttp request handling"
        else:
            part = "asyncio and other"
        parts[part] += n
    total = sum(parts.values()) or 1
    lines = ["| event-loop thread, busy samples | share |", "| --- | --- |"]
    lines += [f"| {k} | {n / total:.1%} |" for k, n in parts.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--loop"]:
        loop(args_in[1], float(args_in[2]))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    p.add_argument("--seconds", type=float, default=15.0, help="sampling time of each profile")
    p.add_argument("--quick", action="store_true", help="the tiny node, 2 s each")
    a = p.parse_args(args_in)
    case = fleets.target(a.quick)
    seconds = 2.0 if a.quick else a.seconds
    spy = py_spy()
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-profile-") as tmp:
        work = Path(tmp)
        fleet = case.write(work)
        print(f"### Collection cycle, {case.name} ({seconds:g} s of cycles, py-spy 1 kHz)\n")
        print(cycle_profile(spy, fleet, seconds, work))
        print(f"\n### Scrapes, {case.name} (10 concurrent gzip scrapers, {seconds:g} s)\n")
        print(scrape_profile(spy, fleet, seconds, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
