"""The device check's report: report.md for people, report.json with every row.

Both are rewritten after each phase, so a run cut short (a lent machine taken back,
Ctrl-C) still leaves what it measured, marked incomplete.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

BAD = ("MISMATCH", "MISSING", "EXTRA")
SHOWN = 200  # mismatch rows in the markdown (all are in the JSON)


def table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def failures(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result.get("rows", []) if r["verdict"] in BAD]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v).replace("|", "/")


def _per_field(rows: list[dict[str, Any]]) -> list[list[str]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["field"]].append(r)
    out = []
    for field, rs in by.items():
        n = Counter(r["verdict"] for r in rs)
        bad = sum(n[v] for v in BAD)
        ex = next((r for r in rs if r["verdict"] in BAD), None) or next(
            (r for r in reversed(rs) if r["verdict"] == "ok"), rs[-1]
        )
        values = " / ".join(_cell(ex[k]) for k in ("before", "exporter", "after"))
        example = f"GPU {ex['gpu']}: {values}"
        verdict = "ok" if not bad else ", ".join(f"{n[v]} {v}" for v in BAD if n[v])
        if not bad and n["ok"] == 0:
            verdict = "n/a (neither serves it here)"
        out.append([field, rs[0]["nvidia_smi"], rs[0]["tolerance"], str(len(rs)), verdict, example])
    return out


def markdown(result: dict[str, Any]) -> str:
    bad = failures(result)
    state = "complete" if result.get("complete") else f"INCOMPLETE ({result.get('phase', '?')})"
    title = "FAIL" if bad or result.get("error") else "PASS"
    lines = [
        f"# Device check: {title}",
        "",
        table(
            ["", ""],
            [[k, _cell(v)] for k, v in result.get("about", {}).items()]
            + [["run", state], ["mismatches", str(len(bad))]],
        ),
        "",
    ]
    if result.get("error"):
        lines += [f"**Could not run:** {result['error']}", ""]
    if result.get("rows"):
        lines += [
            "## Every compared field",
            "",
            "Values are nvidia-smi before / the exporter / nvidia-smi after, in the exporter's"
            " unit; the tolerance says what counts as agreement (tools/devicecheck/compare.py).",
            "",
            table(
                ["field", "nvidia-smi", "tolerance", "compared", "verdict", "example"],
                _per_field(result["rows"]),
            ),
            "",
        ]
    if bad:
        keys = ("cycle", "gpu", "field", "nvidia_smi", "before", "exporter", "after")
        rows = [[*(_cell(r[k]) for k in keys), r["tolerance"], r["verdict"]] for r in bad[:SHOWN]]
        heads = ["cycle", "GPU", "field", "nvidia-smi", "before", "exporter", "after"]
        lines += ["## Mismatches", "", table([*heads, "tolerance", "verdict"], rows), ""]
        if len(bad) > SHOWN:
            lines += [f"{len(bad) - SHOWN} more in report.json.", ""]
    lines += _matrix(result) + _costs(result) + _process(result) + _probes(result)
    dropped = result.get("smi_unknown_fields")
    if dropped:
        lines += [f"nvidia-smi here does not know: {', '.join(dropped)}.", ""]
    return "\n".join(lines)


def _matrix(result: dict[str, Any]) -> list[str]:
    m = result.get("matrix")
    if not m:
        return []
    models = list(m)
    rows = [[f, *(m[model][f] for model in models)] for f in next(iter(m.values()))]
    driver = result.get("about", {}).get("driver", "?")
    head = f"## Field support (driver {driver})"
    return [head, "", table(["field", *models], rows), ""]


def _costs(result: dict[str, Any]) -> list[str]:
    costs = result.get("costs")
    if not costs:
        return []
    rows = [
        [name, str(c["calls"]), f"{c['median_us']:.1f}", f"{c['p99_us']:.1f}", f"{c['model_us']:g}"]
        for name, c in costs.items()
    ]
    fit = result.get("per_field_us")
    note = (
        f"nvmlDeviceGetFieldValues: {fit[0]:.1f} us + {fit[1]:.2f} us per field id (fitted)."
        if fit
        else ""
    )
    return [
        "## NVML call costs (us per call)",
        "",
        table(["function", "calls", "median", "p99", "simulator's model"], rows),
        "",
        note,
        "",
        "As the simulator's latency model (a fleet file's `latency:` section):",
        "",
        "```yaml",
        result.get("latency_yaml", "").rstrip(),
        "```",
        "",
    ]


def _process(result: dict[str, Any]) -> list[str]:
    runs = result.get("process")
    if not runs:
        return []
    keys = ("window_s", "cycles", "cpu_ms_per_cycle", "cpu_percent", "rss_mib", "peak_rss_mib")
    rows = [[k, *(_cell(r.get(k)) for r in runs)] for k in keys]
    return [
        "## The exporter collecting every second",
        "",
        table(["", *(r["driver"] for r in runs)], rows),
        "",
    ]


def _probes(result: dict[str, Any]) -> list[str]:
    probes = result.get("probes")
    if not probes:
        return []
    rows = [
        [p["item"], p["question"], _cell(p["answer"]), _cell(p["detail"])[:400]] for p in probes
    ]
    head = "## NVML review probes" + (
        " (the simulator's answers)" if result.get("simulated") else ""
    )
    return [head, "", table(["item", "question", "answer", "detail"], rows), ""]


def write(out: Path, result: dict[str, Any]) -> None:
    """report.md and report.json in ``out``, each replaced whole (never half written)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("report.json", json.dumps(result, indent=1, default=str)),
        ("report.md", markdown(result)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, out / name)
