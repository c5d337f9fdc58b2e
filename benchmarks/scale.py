"""The scale curve: CPU per cycle and RSS against the number of GPUs, without and with pods.

Written into the report from the results of a run: the in-process cycle
(benchmarks/cycle.py) per fleet, the exporter process per fleet without
pods, and the same process with -k and the first pod count (60 in full runs)
per fleet; then the least-squares fit *fixed + per GPU* over the whole-GPU
fleets for each column.
"""

from __future__ import annotations

from typing import Any

from benchmarks.stats import fit

# (column title, unit, getter over (cycle row, process row, process row with pods))
_Getter = Any
COLUMNS: tuple[tuple[str, str, _Getter], ...] = (
    ("cycle CPU, net", "ms", lambda c, p, q: c["net_ms"]),
    ("cycle CPU, measured", "ms", lambda c, p, q: c["cycle_cpu_ms"]),
    ("process CPU per 1 s cycle", "ms", lambda c, p, q: p and p["cpu_1s"] * 1e3),
    ("the same with pods", "ms", lambda c, p, q: q and q["cpu_1s"] * 1e3),
    ("RSS", "MiB", lambda c, p, q: p and p["rss_mib"]),
    ("RSS with pods", "MiB", lambda c, p, q: q and q["rss_mib"]),
)


def _cell(v: float | None) -> str:
    return "" if v is None else f"{v:,.2f}"


def rows(res: dict[str, Any]) -> list[tuple[str, int, int, list[float | None]]]:
    """(fleet, GPUs, MIG instances, column values) per fleet, by devices."""
    fl, proc, pods = res["fleets"], res["process"], res.get("scale_pods") or {}
    out = []
    for name, c in res["cycle"].items():
        vals = [get(c, proc.get(name), pods.get(name)) for _, _, get in COLUMNS]
        out.append((name, fl[name]["gpus"], fl[name]["mig"], vals))
    return sorted(out, key=lambda r: (r[1] + r[2], r[2]))


def fits(res: dict[str, Any]) -> list[tuple[str, str, tuple[float, float, float] | None]]:
    """(column, unit, (fixed, per GPU, R²) over the whole-GPU fleets, or None) per column."""
    whole = [r for r in rows(res) if r[2] == 0]
    out = []
    for i, (title, unit, _) in enumerate(COLUMNS):
        pts = [(r[1], r[3][i]) for r in whole if r[3][i] is not None]
        line = None
        if len(pts) >= 2:
            a, b, r2 = fit([float(x) for x, _ in pts], [float(y) for _, y in pts])
            line = (a, b, r2)
        out.append((title, unit, line))
    return out


def section(res: dict[str, Any]) -> list[str]:
    """The report's "Scale curve" section, as Markdown lines."""
    pods = res.get("scale_pods") or {}
    n = next(iter(pods.values()))["pods"] if pods else 0
    lines = [
        "## Scale curve",
        "",
        "CPU per collection cycle and RSS per fleet (full runs: 1, 8, 16, 32 and 64 whole "
        "H100s, the default fleet of 8 H100s with 11 MIG instances, and 8 H100s with 56 MIG "
        "instances), without pods and with `-k` and "
        f"{n} pods (the stand-in kubelet, first pods "
        "holding one device each). *cycle CPU* is in-process (benchmarks/cycle.py; *net* = "
        "the exporter's own CPU + the modelled driver cost); *process CPU per 1 s cycle* is "
        "the exporter process at `-c 1000`, no scrapes, simulator included (/proc). RSS after "
        "warm-up.",
        "",
        "| fleet | GPUs | MIG | " + " | ".join(f"{t} {u}" for t, u, _ in COLUMNS) + " |",
        "| " + " | ".join(["---"] * (3 + len(COLUMNS))) + " |",
    ]
    for name, gpus, mig, vals in rows(res):
        cells = [name, str(gpus), str(mig), *map(_cell, vals)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Fit over the whole-GPU fleets: *fixed + per GPU x GPUs*.", ""]
    lines += ["| quantity | fixed | per GPU | R² |", "| --- | --- | --- | --- |"]
    for title, unit, line in fits(res):
        if line is not None:
            a, b, r2 = line
            lines.append(f"| {title} | {a:,.2f} {unit} | {b:,.3f} {unit} | {r2:.3f} |")
    return [*lines, ""]
