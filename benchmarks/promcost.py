"""What the default costs in Prometheus: writes its section of docs/benchmarks.md.

    python -m benchmarks.promcost [--nodes 100] [--minutes 3] [--out docs/benchmarks.md]

Runs benchmarks/expocost.py (samples, bytes and series per GPU of every simulated fleet
under dcgm-exporter's default, the shipped default and the extended file; what each
extended row adds per device) and benchmarks/promfleet.py (a real Prometheus over
``--nodes`` simulated nodes: rule groups' evaluation time, the fleet dashboard's query
time), and replaces the part of ``--out`` between ``<!-- promcost:begin -->`` and
``<!-- promcost:end -->`` (appended the first time).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import expocost, promfleet

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- promcost:begin -->", "<!-- promcost:end -->"
SYNTHETIC = 5  # up, scrape_duration_seconds and the three scrape_samples/series counts
FILES = ("dcgm-exporter", "default", "extended")


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _fleets(fleets: dict[str, Any]) -> list[str]:
    out = [
        "| fleet | GPUs | MIG | file | samples | DCGM samples | DCGM series per GPU | "
        "KiB | gzip KiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_file in fleets.items():
        for f in FILES:
            c = by_file[f]
            out.append(
                _row(name, c["gpus"], c["mig"], f, c["samples"], c["dcgm_samples"],
                     c["dcgm_per_gpu"], f"{c['bytes'] / 1024:.0f}", f"{c['gzip_bytes'] / 1024:.1f}")
            )  # fmt: skip
    return out


def _projection(fleets: dict[str, Any], recorded_per_node: float) -> list[str]:
    out = [
        "| node | file | active series per node | 1,000 nodes | 10,000 nodes | x dcgm-exporter |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("default", "h100x8-mig56"):
        if name not in fleets:
            continue
        base = fleets[name]["dcgm-exporter"]["samples"] + SYNTHETIC + recorded_per_node
        for f in FILES:
            per = fleets[name][f]["samples"] + SYNTHETIC + recorded_per_node
            out.append(
                _row(name, f, f"{per:,.0f}", f"{per * 1000:,.0f}", f"{per * 10000:,.0f}",
                     f"{per / base:.2f}")
            )  # fmt: skip
    return out


def _rows(rows: list[dict[str, Any]], default: set[str]) -> list[str]:
    out = [
        "| row | in the default | series on the node | per whole GPU | per MIG instance |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "bytes_added" in r:
            out.append(_row(r["row"], "1 of 11", "none", f"+{r['bytes_added'] / 1024:.0f} KiB "
                            "per scrape (a label on every series)", ""))  # fmt: skip
            continue
        inside = "yes" if r["row"] in default else ""
        out.append(
            _row(f"`{r['row']}`", inside, r["series"], r["per_whole_gpu"], r["per_mig_instance"])
        )
    return out


def _queries(q: dict[str, Any]) -> list[str]:
    def total(part: str) -> tuple[float, int]:
        return sum(r["ms"] for r in q[part]), sum(r["samples"] for r in q[part])

    out = ["| fleet dashboard | queries | Prometheus ms (sum) | samples read |"]
    out.append("|---|---|---|---|")
    names = {
        "view": "fleet view (recorded per-node series; per-GPU row collapsed)",
        "view_inlined": "the same queries with every recorded series inlined",
        "per_gpu": "the per-GPU row, opened on every node",
    }
    for part, label in names.items():
        ms, samples = total(part)
        out.append(_row(label, len(q[part]), f"{ms:.1f}", f"{samples:,}"))
    return out


def _groups(groups: dict[str, float]) -> list[str]:
    out = ["| rule group | ms per evaluation | inlined ms |", "|---|---|---|"]
    for name, ms in groups.items():
        if name.startswith("inlined-"):
            continue
        inlined = groups.get(f"inlined-{name}")
        out.append(_row(name, ms, "" if inlined is None else inlined))
    return out


def render(expo: dict[str, Any], prom: dict[str, Any], seconds: float) -> str:
    """The section's Markdown."""
    default = {ln.split(",")[0] for ln in expocost.FILES["default"].read_text().splitlines()
               if ln.startswith("DCGM_")}  # fmt: skip
    recorded = prom["recorded_series"] / prom["nodes"]
    lines = [
        BEGIN,
        "",
        "## What the default costs in Prometheus",
        "",
        f"`python -m benchmarks.promcost --nodes {prom['nodes']}` ({seconds:.0f} s, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.machine()}, "
        f"Python {platform.python_version()}, {promfleet.prometheus_version()}). "
        "Three metrics files: dcgm-exporter 4.8.2's `default-counters.csv` as NVIDIA ships "
        "it, the shipped default (its rows plus the ones the bundled alerts, rules and "
        "dashboards read: docs/compatibility.md) and `metrics-extended.csv` (every row). "
        "Each simulated fleet runs six cycles with `-k`, every device held by a pod of its "
        "own; a sample is one series a Prometheus keeps.",
        "",
        *_fleets(expo["fleets"]),
        "",
        "Active series per node = samples per scrape + 5 series Prometheus adds per target "
        "(`up`, `scrape_duration_seconds`, `scrape_samples_scraped`, "
        "`scrape_samples_post_metric_relabeling`, `scrape_series_added`) + the series the "
        f"recording rules write per node ({recorded:.0f}, measured below: "
        f"{prom['recorded_series']:,.0f} over {prom['nodes']} nodes). A fleet is that "
        "times its nodes, all nodes alike, without churn (a pod or MIG layout that changes "
        "adds series until they go stale; retention multiplies storage, not active series).",
        "",
        *_projection(expo["fleets"], recorded),
        "",
        "### What each row of the extended file adds (default node: 8 x H100, 11 MIG "
        "instances on 2 GPUs, `-d f`)",
        "",
        "A device-level row repeats on each MIG instance of a MIG GPU; families with labels "
        "of their own (health watches, P2P peers, XID codes, clock-event reasons) add one "
        "series per value.",
        "",
        *_rows(expo["rows"], default),
        "",
        f"### Rules and the fleet dashboard on a real Prometheus, {prom['nodes']} nodes",
        "",
        promfleet.__doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
        "",
        *_groups(prom["groups_ms"]),
        "",
        *_queries(prom["queries"]),
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def write(out: Path, section: str) -> None:
    text = out.read_text() if out.exists() else ""
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        text = before + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.promcost", description=__doc__)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    expo = expocost.measure()
    prom = promfleet.measure(a.nodes, a.minutes)
    write(a.out, render(expo, prom, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
