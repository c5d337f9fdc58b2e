"""The device check's phases, each adding to the result (written out after each one).

1. compare: the exporter's collector and nvidia-smi, cycle by cycle;
2. matrix: which fields each GPU model answers;
3. costs: each NVML call the exporter made, timed (and replayed to ``calls`` samples);
4. probes: the NVML review's questions;
5. process: the exporter as a process collecting every second, real and simulated.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.collector import Collector
from exporter.sim.latency import DEFAULT_COSTS_US, DEFAULT_US
from exporter.snapshot import Snapshot
from tools.devicecheck import calls, compare, crosschecks, matrix, probes, process
from tools.devicecheck.node import Node
from tools.devicecheck.nvsmi import SmiError

Result = dict[str, Any]
Save = Callable[[str], None]


def compare_phase(
    node: Node, col: Collector, cycles: int, interval: float, res: Result
) -> list[Snapshot]:
    """The exporter's cycles between two nvidia-smi reads each; rows into ``res``."""
    smi = node.smi
    rows: list[dict[str, Any]] = res.setdefault("rows", [])
    col.collect()  # the first cycle primes the rates
    time.sleep(interval)
    snaps: list[Snapshot] = []
    power: dict[int, list[float]] = defaultdict(list)
    for c in range(cycles):
        before, _ = smi.query(compare.QUERY)
        pa = _dmon(node, res)
        snap = col.collect()
        after, _ = smi.query(compare.QUERY)
        pb = _dmon(node, res)
        mig = {
            g.key
            for g in snap.gpus
            if (after.get(g.index) or {}).get("mig.mode.current") == "Enabled"
        }
        mig |= {g.key for g in snap.gpus if any(e.parent is g for e in snap.entities)}
        rows += compare.compare_cycle(c, snap, before, after, mig)
        more = crosschecks.pcie_rows(snap, pa, pb) if pa or pb else []
        _power(power, before, after)
        if snaps:
            more += crosschecks.energy_rows(snaps[-1], snap, power)
            power.clear()
            _power(power, after)
        rows += [{**r, "cycle": c} for r in more]
        snaps.append(snap)
        time.sleep(interval)
    if any(e.is_mig for e in snaps[-1].entities):
        try:
            rows += crosschecks.mig_rows(snaps[-1], smi.mig_instances(), smi.mig_profiles())
        except SmiError as e:
            res["mig_unreadable"] = str(e)
    res["smi_unknown_fields"] = list(smi.dropped)
    return snaps


def _power(into: dict[int, list[float]], *reads: dict[int, Any]) -> None:
    """Add each GPU's power.draw of nvidia-smi reads (W)."""
    for read in reads:
        for i, row in read.items():
            if row.get("power.draw") is not None:
                into[i].append(float(row["power.draw"]))


def _dmon(node: Node, res: Result) -> dict[int, tuple[float, float]]:
    if res.get("dmon_unreadable"):
        return {}
    try:
        return node.smi.pcie_mbps()
    except SmiError as e:
        res["dmon_unreadable"] = str(e)
        return {}


def costs_phase(rec: calls.Recorder, n: int, res: Result) -> None:
    rec.replay(n)
    costs = rec.costs()
    for name, c in costs.items():
        c["model_us"] = DEFAULT_COSTS_US.get(name, DEFAULT_US)
    res["costs"] = costs
    res["per_field_us"] = rec.per_field()
    res["latency_yaml"] = calls.latency_model(costs, rec.per_field())


def run(node: Node, args: Any, res: Result, save: Save) -> None:
    """Every phase on an open node; ``save(phase)`` after each."""
    rec = calls.Recorder(_library())
    rec.install()
    col = Collector(matrix.every_field(), socket.gethostname())
    try:
        save("compare")
        snaps = compare_phase(node, col, args.cycles, args.interval, res)
        save("matrix")
        res["matrix"] = matrix.matrix(snaps, rec)
        save("costs")
        costs_phase(rec, args.calls, res)
        save("probes")
        res["probes"] = probes.run_all()
        gpus = list(snaps[-1].gpus)
    finally:
        col.close(0.5)
        rec.uninstall()
    if args.no_process:
        return
    save("process")
    work = Path(tempfile.mkdtemp(prefix="device-check-"))
    runs = res.setdefault("process", [])
    if node.simulated:
        assert node.fleet is not None
        runs.append(process.measure(node.fleet, args.process_seconds, work / "exporter.log"))
        return
    node.close()  # the exporter process opens NVML itself
    library = os.path.dirname(node.where) if node.where.startswith("/") else None
    runs.append(process.measure(None, args.process_seconds, work / "real.log", library))
    mirror = process.mirror_fleet(gpus, res["about"].get("driver", ""), work / "mirror.yaml")
    runs.append(process.measure(mirror, args.process_seconds, work / "sim.log"))


def _library() -> Any:
    import pynvml

    return pynvml.nvmlLib
