"""Soak: many collection cycles through the exporter's own code, with churn and faults.

    python -m tests.reliability.soak [--cycles 100000] [--write-doc]   (prints JSON)

Runs the real Poller (worker thread, Collector over pynvml and the simulated
driver, XID event thread, rendering, self-metrics, gzip) with pod attribution
(Attribution and Mapper, answered by a generated kubelet List instead of a
socket) on tests/fixtures/reliability/soak.yaml, back to back on a ManualClock
that moves 1 s per cycle, and keeps going through:

- pod churn: every cycle one device changes hands to a pod never seen before,
  and the time-sliced GPU's three replicas change owners in turn;
- MIG churn: every 50 cycles GPU 2 or GPU 3 gets a new MIG layout (new UUIDs);
- XID events: 3 every 10 cycles, on a GPU and XID that move round (counted), 79 and
  119 through the simulated kernel log, the others as NVML events;
- overheating every 500 cycles and a double-bit ECC error every 2,000.

Every ``--sample`` cycles it records RSS, threads, open files, series and
exposition size; tests/reliability/test_soak.py asserts they stay flat, and
``--write-doc`` puts the numbers of a run into docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import KubeConfig, default_metrics_file
from exporter.poller import Poller
from exporter.sim.faults import Fault
from exporter.workloads.attribution import Attribution
from exporter.workloads.kubelet.generated import podresources_pb2 as pb

ROOT = Path(__file__).parents[2]
FLEET = ROOT / "tests" / "fixtures" / "reliability" / "soak.yaml"
DOC = ROOT / "docs" / "reliability.md"
EPOCH = 1.8e9
LAYOUTS = (
    [{"profile": "1g.10gb"}] * 7,
    [
        {"profile": "3g.40gb"},
        {"profile": "2g.20gb"},
        {"profile": "1g.10gb"},
        {"profile": "1g.10gb"},
    ],
)
XIDS = (13, 31, 43, 48, 79, 94, 119)


def rss_mib() -> float:
    """Resident set size of this process, MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


class GeneratedKubelet:
    """Stands in for PodResourcesClient: a List answer made from the node's devices now.

    Whole GPU 0 and every MIG instance are held by one pod each; GPU 1 is
    time-sliced into three replicas. Each cycle, one holder is replaced by a new
    pod (``turn`` moves round the devices), so names never repeat.
    """

    def __init__(self, driver: sim.SimDriver) -> None:
        self.driver = driver
        self.turn = 0
        self.names: dict[str, str] = {}  # device id -> pod name holding it now
        self.calls = 0

    def next_cycle(self) -> None:
        ids = self._device_ids()
        if ids:
            victim = ids[self.turn % len(ids)]
            self.names[victim] = f"job-{self.turn}"
        self.turn += 1

    def _device_ids(self) -> list[str]:
        g = self.driver.gpus
        out = [g[0].uuid] + [f"{g[1].uuid}::{r}" for r in range(3)]
        for gpu in g[2:]:
            out += [m.uuid for m in gpu.migs]
        return out

    async def list(self) -> pb.ListPodResourcesResponse:
        self.calls += 1
        resp = pb.ListPodResourcesResponse()
        ids = self._device_ids()
        for device_id in ids:
            name = self.names.setdefault(device_id, f"job-start-{len(self.names)}")
            pod = resp.pod_resources.add(name=name, namespace="soak")
            c = pod.containers.add(name="main")
            resource = "nvidia.com/gpu" if device_id.startswith("GPU-") else "nvidia.com/mig-x"
            c.devices.add(resource_name=resource, device_ids=[device_id])
        # the kubelet still reports a few instances that are gone (it lags MIG changes)
        live = set(ids)
        for i, device_id in enumerate(k for k in self.names if k not in live):
            if i >= 3:
                break
            pod = resp.pod_resources.add(name=f"stale-{i}", namespace="soak")
            pod.containers.add(name="main").devices.add(
                resource_name="nvidia.com/mig-x", device_ids=[device_id]
            )
        # forget holders of devices gone long ago: the generator itself must not grow
        for device_id in [k for k in self.names if k not in live][3:]:
            del self.names[device_id]
        return resp

    async def list_bytes(self) -> bytes:
        return (await self.list()).SerializeToString()

    async def close(self) -> None:
        pass


class NoApiServer:
    """Stands in for the API-server watcher: knows no pods (pod labels stay off)."""

    status = ""
    pods_synced = False

    def pod(self, uid: str) -> None:
        return None

    def pod_by_name(self, namespace: str, name: str) -> None:
        return None

    def slice_device(self, driver: str, pool: str, name: str) -> None:
        return None

    def stop(self) -> None:
        pass


@dataclass
class Sample:
    cycle: int
    rss_mib: float
    threads: int
    open_files: int
    series: int
    exposition_bytes: int
    seconds: float


@dataclass
class Result:
    cycles: int
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    xid_injected: int = 0
    xid_counted: int = 0
    failed_cycles: int = 0
    mig_changes: int = 0
    pod_changes: int = 0
    kubelet_lists: int = 0

    def window(self, start: int) -> list[Sample]:
        return [s for s in self.samples if s.cycle >= start]


def _schedule(i: int, driver: sim.SimDriver, ok: bool, result: Result) -> None:
    """Faults and churn due before cycle ``i``."""
    if i % 50 == 25:
        gpu = 2 + (i // 50) % 2
        layout = LAYOUTS[(i // 100) % 2]
        driver.inject(Fault("mig_reconfigure", gpu=gpu, mig=layout))
        result.mig_changes += 1
    # XIDs only while events are watched (from the first cycle on)
    if i % 10 == 0 and ok:
        gpu = (i // 10) % 4
        xid = XIDS[(i // 40) % len(XIDS)]
        driver.inject(Fault("xid", gpu=gpu, xid=xid, count=3))
        result.xid_injected += 3
    if i % 500 == 100:
        driver.inject(Fault("overheat", gpu=(i // 500) % 4, temp_c=95, duration=30))
    if i % 2000 == 700:
        driver.inject(Fault("ecc_dbe", gpu=0))


async def soak(
    cycles: int, sample: int = 500, fleet: Path = FLEET, trace: bool = False, warmup: int = 1000
) -> Result:
    """Run ``cycles`` cycles; samples every ``sample`` cycles and at the end.

    With ``trace`` (tracemalloc started by the caller), prints the Python allocations
    that grew most between cycle ``warmup`` and the end, by source line.
    """
    clock = sim.ManualClock()
    kmsg = Path(tempfile.mkdtemp(prefix="soak-")) / "kmsg"
    driver = sim.install(fleet, clock=clock, latency=False, kernel_log=kmsg)
    catalog = load(default_metrics_file())
    kube = KubeConfig(node_name="soak-node", socket="/nonexistent/kubelet.sock", timeout_s=5.0)
    attribution = Attribution(kube, watcher=NoApiServer())
    kubelet = GeneratedKubelet(driver)
    attribution.mapper.client = kubelet  # type: ignore[assignment]
    collector = Collector(
        catalog,
        "soak-node",
        wants_processes=attribution.wants_processes,
        clock=lambda: EPOCH + clock(),
        kernel_log=str(kmsg),
    )
    poller = Poller(catalog, collector, 1.0, 30.0, attribution)
    result = Result(cycles, 0.0)
    t0 = time.perf_counter()
    ok = False  # no XID before the first cycle has registered for events
    try:
        for i in range(cycles):
            _schedule(i, driver, ok, result)
            kubelet.next_cycle()
            await poller.cycle()
            ok = poller.snapshot is not None and poller.snapshot.ok
            result.failed_cycles += not ok
            clock.advance(1.0)
            if trace and i == warmup:
                before = tracemalloc.take_snapshot()
            if i % sample == 0 or i == cycles - 1:
                result.samples.append(
                    Sample(
                        i,
                        rss_mib(),
                        threading.active_count(),
                        open_files(),
                        poller.selfmetrics.series,
                        len(poller.exposition.plain),
                        time.perf_counter() - t0,
                    )
                )
        result.seconds = time.perf_counter() - t0
        if trace:
            grown = tracemalloc.take_snapshot().compare_to(before, "traceback")
            for stat in grown[:8]:
                print(stat, *stat.traceback.format()[-6:], sep="\n  ", file=sys.stderr)
        result.pod_changes = kubelet.turn
        result.kubelet_lists = kubelet.calls
        assert collector.xid is not None
        end = time.monotonic() + 10
        while time.monotonic() < end:  # let the event thread take the last events
            result.xid_counted = sum(n for *_, n in collector.xid.state().counts)
            if result.xid_counted >= result.xid_injected:
                break
            await asyncio.sleep(0.05)
    finally:
        await attribution.close()
        collector.close()
        poller.close()
        sim.uninstall()
    return result


def summary(r: Result, warmup: int) -> dict[str, Any]:
    """Growth after warm-up and the ranges seen, for JSON output and the doc."""
    w = r.window(warmup)
    first, last = w[0], w[-1]
    return {
        "cycles": r.cycles,
        "seconds": round(r.seconds, 1),
        "ms_per_cycle": round(r.seconds / r.cycles * 1000, 2),
        "rss_mib_after_warmup": round(first.rss_mib, 1),
        "rss_mib_end": round(last.rss_mib, 1),
        "rss_mib_max": round(max(s.rss_mib for s in w), 1),
        "rss_growth_mib": round(last.rss_mib - first.rss_mib, 2),
        "threads": sorted({s.threads for s in w}),
        "open_files": sorted({s.open_files for s in w}),
        "series_range": [min(s.series for s in w), max(s.series for s in w)],
        "exposition_kib_max": round(max(s.exposition_bytes for s in w) / 1024, 1),
        "xid_injected": r.xid_injected,
        "xid_counted": r.xid_counted,
        "failed_cycles": r.failed_cycles,
        "mig_changes": r.mig_changes,
        "pod_changes": r.pod_changes,
    }


def write_doc(s: dict[str, Any], doc: Path = DOC) -> None:
    """Replace the block between the soak markers in docs/reliability.md."""
    rows = [
        ("cycles", f"{s['cycles']:,} in {s['seconds']:,} s ({s['ms_per_cycle']} ms a cycle)"),
        (
            "RSS",
            f"{s['rss_mib_after_warmup']} MiB after warm-up, {s['rss_mib_end']} MiB at the end "
            f"(max {s['rss_mib_max']}); growth {s['rss_growth_mib']} MiB",
        ),
        ("threads", ", ".join(map(str, s["threads"]))),
        ("open files", ", ".join(map(str, s["open_files"]))),
        ("DCGM series", f"{s['series_range'][0]} to {s['series_range'][1]}"),
        ("largest exposition", f"{s['exposition_kib_max']} KiB"),
        ("XID events", f"{s['xid_injected']:,} injected, {s['xid_counted']:,} counted"),
        (
            "churn and faults",
            f"{s['pod_changes']:,} pod changes, {s['mig_changes']:,} MIG layouts "
            f"({s['failed_cycles']} failed cycles)",
        ),
    ]
    table = "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    text = doc.read_text()
    block = f"<!-- soak:begin -->\n{table}<!-- soak:end -->"
    new, n = re.subn(r"<!-- soak:begin -->.*?<!-- soak:end -->", block, text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{doc}: no soak markers to write between")
    doc.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=100_000)
    p.add_argument("--sample", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=5000, help="cycles before growth is measured")
    p.add_argument("--write-doc", action="store_true", help="write the numbers into the doc")
    p.add_argument("--trace", action="store_true", help="print where Python memory grew")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the churn logs by design; keep the run quiet
    if args.trace:
        tracemalloc.start(8)
    r = asyncio.run(soak(args.cycles, args.sample, trace=args.trace, warmup=args.warmup))
    s = summary(r, args.warmup)
    print(json.dumps({**s, "samples": [asdict(x) for x in r.samples]}, indent=1))
    if args.write_doc:
        write_doc(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
