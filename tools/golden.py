"""The bytes /metrics serves, captured on every simulated fleet, to compare two builds.

    python3 -m tools.golden capture DIR      # one .prom file per fleet, release and -k
    python3 -m tools.golden compare A B      # exits 1 and names the first differing line

Each case installs a simulated fleet on a manual clock (no latency model), builds the
exporter's application from flags as the command line does, and runs six cycles of its
poller at 1 s steps; with ``-k`` a pod-resources server (grpcio, on a unix socket) hands
every device to a pod of its own, MIG instances first, in turn. The file is the last
exposition without the families whose values are timings (``process_*``, the
collection and collector durations). A refactoring that changes no behaviour leaves every file as
it was.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
import tempfile
from pathlib import Path

FLEETS = Path(__file__).parents[1] / "exporter" / "sim" / "fleets"
RELEASES = ("4.8.2", "4.8.4", "4.9")
CYCLES = 6
EPOCH = 1.8e9
# timings: they differ from run to run
TIMED = (b"process_", b"gpu_exporter_collection_duration_seconds",
         b"gpu_exporter_collector_duration_seconds")  # fmt: skip


def _own(line: bytes) -> bool:
    if line.startswith((b"# HELP ", b"# TYPE ")):
        line = line[7:]
    return line.startswith(TIMED)


async def _cycles(poller, clock) -> bytes:
    for _ in range(CYCLES):
        clock.advance(1.0)
        await poller.cycle()
    return poller.exposition.plain


def capture_one(fleet: Path, release: str, kube: bool, tmp: Path) -> bytes:
    """The last of six expositions of ``fleet`` under ``release``, with or without -k."""
    from benchmarks.kubelet import serve_devices
    from benchmarks.pods import device_ids_of
    from exporter import app, cli, sim
    from exporter.catalog.metricsfile import load
    from exporter.config.resolve import config_from

    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock, latency=False)
    server = None
    try:
        # a collect timeout no loaded machine reaches: the bytes must not depend on load
        argv = ["--dcgm-exporter-version", release, "-c", "1000", "--collect-timeout", "600000"]
        if kube:
            socket = tmp / f"{fleet.stem}-{release}.sock"
            server = serve_devices(socket, device_ids_of(driver))
            argv += ["-k", "--pod-resources-kubelet-socket", str(socket)]
        cfg = config_from(cli.build_parser().parse_args(argv), {"NODE_NAME": "node-a"})
        catalog = load(cfg.metrics_file, cfg.old_names, cfg.release.dcgm47)
        application = app.build(cfg, catalog)
        poller = application[app.POLLER]
        poller.collector.clock = lambda: EPOCH + clock()
        try:
            body = asyncio.run(_cycles(poller, clock))
        finally:
            poller.collector.close()
            poller.close()
    finally:
        if server is not None:
            server.stop(None)
        sim.uninstall()
    return b"".join(line for line in body.splitlines(keepends=True) if not _own(line))


def capture(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fleet in sorted(FLEETS.glob("*.yaml")):
            for release in RELEASES:
                for kube in (False, True):
                    name = f"{fleet.stem}-{release}-{'k' if kube else 'nok'}.prom"
                    body = capture_one(fleet, release, kube, Path(tmp))
                    (out / name).write_bytes(body)
                    print(f"{name}: {len(body)} bytes", flush=True)
    return 0


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.prom")} | {p.name for p in b.glob("*.prom")})
    bad = 0
    for name in names:
        x, y = a / name, b / name
        if not (x.exists() and y.exists()):
            print(f"{name}: only in {a if x.exists() else b}")
            bad += 1
        elif x.read_bytes() != y.read_bytes():
            bad += 1
            diff = difflib.unified_diff(
                x.read_text().splitlines(), y.read_text().splitlines(), str(x), str(y), n=0
            )
            print("\n".join(list(diff)[:12]))
    print(f"{len(names) - bad} of {len(names)} captures identical")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tools.golden", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("capture").add_argument("dir", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "capture":
        return capture(args.dir)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
