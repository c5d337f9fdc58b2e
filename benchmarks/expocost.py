"""What one node's /metrics costs a Prometheus, per metrics file: samples and bytes per
scrape, series per GPU, and what each row of the extended file adds per device.

    python -m benchmarks.expocost            (prints JSON; benchmarks/promcost.py writes it up)

Each case runs the exporter's application as the command line builds it (flags ``-f FILE``,
``-k`` against a pod-resources server that hands every device to a pod of its own, MIG
instances first), on a simulated fleet with a manual clock and no latency model, for six
cycles at 1 s steps, and reads the last exposition: every sample line is one series a
Prometheus keeps. The three files: dcgm-exporter 4.8.2's ``default-counters.csv`` as NVIDIA
ships it (tests/fixtures/csv/nvidia-4.8.2/; its vGPU licence row is not served), the
shipped default and the extended file.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "exporter" / "catalog"
FLEETS = ROOT / "exporter" / "sim" / "fleets"
FILES = {
    "dcgm-exporter": ROOT / "tests" / "fixtures" / "csv" / "nvidia-4.8.2" / "default-counters.csv",
    "default": CATALOG / "metrics.csv",
    "extended": CATALOG / "metrics-extended.csv",
}
CYCLES = 6
EPOCH = 1.8e9
SAMPLE = re.compile(rb"^([A-Za-z_:][\w:]*)(\{[^\n]*\})? ", re.M)


@dataclass(frozen=True)
class Exposition:
    """One node's last exposition, and how many physical GPUs and MIG instances it has."""

    body: bytes
    gpus: int
    mig: int
    mig_gpus: int  # GPUs in MIG mode: their series are their instances'

    def families(self) -> dict[str, list[bytes]]:
        """Sample lines by metric name."""
        out: dict[str, list[bytes]] = {}
        for m in SAMPLE.finditer(self.body):
            out.setdefault(m.group(1).decode(), []).append(m.group(2) or b"")
        return out


def capture(fleet: Path, metrics: Path, tmp: Path, cycles: int = CYCLES) -> list[Exposition]:
    """Every exposition of ``cycles`` cycles of ``fleet`` served with ``metrics`` and -k."""
    from benchmarks.kubelet import serve_devices
    from benchmarks.pods import device_ids_of
    from exporter import app, cli, sim
    from exporter.catalog.metricsfile import load
    from exporter.config.resolve import config_from

    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock, latency=False)
    socket = tmp / f"{fleet.stem}-{metrics.stem}.sock"
    server = serve_devices(socket, device_ids_of(driver))
    gpus = len(driver.gpus)
    mig = sum(len(g.migs) for g in driver.gpus if g.mig_enabled)
    mig_gpus = sum(1 for g in driver.gpus if g.mig_enabled)
    try:
        argv = ["-f", str(metrics), "-c", "1000", "-k", "--pod-resources-kubelet-socket"]
        env = {"NODE_NAME": "node-a"}
        cfg = config_from(cli.build_parser().parse_args([*argv, str(socket)]), env)
        application = app.build(cfg, load(cfg.metrics_file, cfg.old_names))
        poller = application[app.POLLER]
        poller.collector.clock = lambda: EPOCH + clock()

        async def run() -> list[bytes]:
            out = []
            for _ in range(cycles):
                clock.advance(1.0)
                await poller.cycle()
                out.append(poller.exposition.plain)
            return out

        try:
            bodies = asyncio.run(run())
        finally:
            poller.collector.close()
            poller.close()
    finally:
        server.stop(None)
        sim.uninstall()
    return [Exposition(b, gpus, mig, mig_gpus) for b in bodies]


def cost(expo: Exposition) -> dict[str, Any]:
    """Samples (DCGM ones apart), plain and gzip bytes, DCGM series per GPU."""
    fams = expo.families()
    samples = sum(len(v) for v in fams.values())
    dcgm = sum(len(v) for k, v in fams.items() if k.startswith("DCGM_"))
    return {
        "gpus": expo.gpus,
        "mig": expo.mig,
        "samples": samples,
        "dcgm_samples": dcgm,
        "bytes": len(expo.body),
        "gzip_bytes": len(gzip.compress(expo.body, 6)),
        "dcgm_per_gpu": round(dcgm / expo.gpus, 1) if expo.gpus else 0.0,
    }


def per_row(expo: Exposition, base: Exposition) -> list[dict[str, Any]]:
    """Per family of the extended file: series per whole GPU, per MIG instance and per node
    (on ``expo``'s fleet), and the bytes a label row adds to the node's scrape."""
    whole = expo.gpus - expo.mig_gpus
    fams = expo.families()
    out = []
    for name, labels in sorted(fams.items()):
        if not name.startswith("DCGM_"):
            continue
        on_mig = sum(1 for lab in labels if b'GPU_I_ID="' in lab and b'GPU_I_ID=""' not in lab)
        out.append(
            {
                "row": name,
                "series": len(labels),
                "per_whole_gpu": round((len(labels) - on_mig) / max(whole, 1), 2),
                "per_mig_instance": round(on_mig / expo.mig, 2) if expo.mig else 0.0,
            }
        )
    out.append({"row": "(label rows, all 11)", "bytes_added": len(expo.body) - len(base.body)})
    return out


def measure(fleets: list[Path] | None = None) -> dict[str, Any]:
    """Every fleet under every file; the extended file's rows on the default fleet."""
    fleets = fleets or sorted(FLEETS.glob("*.yaml"))
    out: dict[str, Any] = {"fleets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for fleet in fleets:
            out["fleets"][fleet.stem] = {
                name: cost(capture(fleet, path, Path(tmp))[-1]) for name, path in FILES.items()
            }
        default = FLEETS / "default.yaml"
        extended = capture(default, FILES["extended"], Path(tmp))[-1]
        unlabelled = Path(tmp) / "extended-without-labels.csv"
        text = FILES["extended"].read_text()
        unlabelled.write_text(re.sub(r"^DCGM_\w+,\s*label,.*\n", "", text, flags=re.M))
        base = capture(default, unlabelled, Path(tmp))[-1]
        out["rows"] = per_row(extended, base)
    return out


def main(argv: list[str] | None = None) -> int:
    json.dump(measure([Path(a) for a in (argv or [])] or None), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
