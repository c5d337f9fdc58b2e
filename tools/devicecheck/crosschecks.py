"""Comparisons that are not one field against one --query-gpu column.

- MIG: the GPU instances and compute instances the exporter serves against
  ``nvidia-smi mig -lgi`` / ``-lci`` (profile names and ids exactly), and each instance's
  framebuffer total against its profile's memory in ``mig -lgip`` (within 2 %);
- energy: nvidia-smi shows no energy counter, so the exporter's counter is checked
  against power instead: its growth between two cycles over the time between them must
  lie within the power nvidia-smi read meanwhile (+-(5 W + 10 %));
- PCIe throughput: against ``nvidia-smi dmon -s t`` samples before and after the cycle,
  within half to one and a half times their range, +-64 MB/s (dmon samples 20 ms, the
  exporter averages over the interval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.snapshot import Snapshot
from tools.devicecheck.compare import Row
from tools.devicecheck.nvsmi import GpuInstance

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


def _row(
    gpu: int, field: str, smi: str, before: Any, x: Any, after: Any, tol: str, ok: bool
) -> Row:
    verdict = "ok" if ok else "MISMATCH"
    if x is None and before is None and after is None:
        verdict = "n/a"
    elif x is None:
        verdict = "MISSING"
    elif before is None and after is None:
        verdict = "EXTRA"
    return {
        "cycle": -1,
        "gpu": gpu,
        "field": field,
        "nvidia_smi": smi,
        "before": before,
        "exporter": x,
        "after": after,
        "tolerance": tol,
        "verdict": verdict,
    }


def mig_rows(
    snap: Snapshot, smi: Sequence[GpuInstance], profiles: Mapping[tuple[int, str], float]
) -> list[Row]:
    """Instances per GPU (exactly) and each instance's memory (within 2 %)."""
    rows = []
    ours = [d for d in snap.entities if d.is_mig]
    for gpu in sorted({d.index for d in ours} | {i.gpu for i in smi}):
        mine_gi = sorted((d.gi, d.profile) for d in ours if d.index == gpu)
        theirs_gi = sorted((i.gi, i.profile) for i in smi if i.gpu == gpu and i.ci < 0)
        rows.append(
            _row(
                gpu,
                "GPU_I_ID, GPU_I_PROFILE",
                "mig -lgi",
                theirs_gi,
                mine_gi,
                None,
                "exact",
                mine_gi == theirs_gi,
            )
        )
        mine_ci = sorted((d.gi, d.ci) for d in ours if d.index == gpu)
        theirs_ci = sorted((i.gi, i.ci) for i in smi if i.gpu == gpu and i.ci >= 0)
        rows.append(
            _row(
                gpu,
                "compute instances (gi, ci)",
                "mig -lci",
                theirs_ci,
                mine_ci,
                None,
                "exact",
                mine_ci == theirs_ci,
            )
        )
    for d in ours:
        gib = profiles.get((d.index, d.profile))
        mib = snap.values.get(d.key, {}).get("DCGM_FI_DEV_FB_TOTAL")
        want = None if gib is None else gib * 1024
        ok = want is not None and mib is not None and abs(mib - want) <= 0.02 * want
        where = f"mig -lgip {d.profile}, GI {d.gi} (MiB)"
        field = "DCGM_FI_DEV_FB_TOTAL of a MIG instance"
        rows.append(_row(d.index, field, where, want, mib, None, "within 2 %", ok))
    return rows


def energy_rows(
    first: Snapshot, second: Snapshot, power: Mapping[int, Sequence[float]]
) -> list[Row]:
    """The energy counter's growth between two cycles, as watts, against nvidia-smi's power."""
    rows = []
    dt = second.taken_at - first.taken_at
    for gpu in second.gpus:
        e0 = first.values.get(gpu.key, {}).get(ENERGY)
        e1 = second.values.get(gpu.key, {}).get(ENERGY)
        reads = power.get(gpu.index, ())
        watts = None if e0 is None or e1 is None or dt <= 0 else (e1 - e0) / 1000 / dt
        lo, hi = (min(reads), max(reads)) if reads else (None, None)
        ok = watts is not None and lo is not None and hi is not None
        if ok:
            tol = 5 + 0.1 * hi
            ok = e1 >= e0 and lo - tol <= watts <= hi + tol
        rows.append(
            _row(
                gpu.index,
                f"{ENERGY} (growth, W)",
                "power.draw",
                lo,
                None if watts is None else round(watts, 2),
                hi,
                "counter grows; rate within power +-(5 W + 10 %)",
                ok,
            )
        )
    return rows


def pcie_rows(
    snap: Snapshot,
    before: Mapping[int, tuple[float, float]],
    after: Mapping[int, tuple[float, float]],
) -> list[Row]:
    """PCIe RX and TX throughput against two dmon samples (MB/s)."""
    rows = []
    for gpu in snap.gpus:
        vals = snap.values.get(gpu.key, {})
        for i, (field, name) in enumerate(
            (
                ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "rxpci"),
                ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "txpci"),
            )
        ):
            kbs = vals.get(field)
            x = None if kbs is None else round(kbs * 1024 / 1e6, 1)
            reads = [s[gpu.index][i] for s in (before, after) if gpu.index in s]
            a = reads[0] if reads else None
            b = reads[-1] if reads else None
            ok = bool(reads) and x is not None
            if ok:
                ok = 0.5 * min(reads) - 64 <= x <= 1.5 * max(reads) + 64
            rows.append(
                _row(
                    gpu.index,
                    f"{field} (MB/s)",
                    f"dmon -s t {name}",
                    a,
                    x,
                    b,
                    "0.5 x .. 1.5 x the dmon range, +-64 MB/s",
                    ok,
                )
            )
    return rows
