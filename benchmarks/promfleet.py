"""A real Prometheus over a simulated fleet of nodes: what the rules and the fleet dashboard
cost it, with the recording rules and with every recorded series inlined.

    python -m benchmarks.promfleet [--nodes 100] [--minutes 3]      (prints JSON)

One process serves every node: the default simulated node (8 x H100, 2 in MIG, every
device held by a pod) is captured once, as a series of expositions one simulated second
apart (benchmarks/expocost.py), and ``/node/<n>`` serves the one for the current scrape
with the node's own ``hostname`` and pod names, so that each simulated node has series of
its own and counters that grow. Prometheus scrapes each node as a target of its own
(``instance`` and ``node`` the node's name, ``honor_labels`` as the ServiceMonitor), every
15 s, and evaluates alerts/'s rule files every 15 s, with beside them a copy of the recording
rules in which every recorded series a rule reads is replaced by the rule that records it
(named ``inlined_*``): what the same rules cost without aggregating through recorded series.

Rule evaluation time: ``prometheus_rule_group_last_duration_seconds`` per group, read from
Prometheus's own /metrics once an evaluation interval after the first minute, median.
Query time: each query of the fleet dashboard (dashboards/gpu-fleet.json; variables "All",
``$__rate_interval`` 1m, ``$__range`` 5m) as a range query over the last 5 minutes at a
15 s step, Prometheus's own evaluation time (``stats``), median of 5; the fleet view (the
panels outside the collapsed per-GPU row, and the variables), the same with the recorded
series inlined, and the per-GPU row opened on every node.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from benchmarks.expocost import FILES, FLEETS, capture
from benchmarks.procs import Prometheus

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = ("gpu-recording.rules.yaml", "gpu-accounting.rules.yaml", "gpu-alerts.rules.yaml")
INTERVAL_S = 15
GRAFANA = {"$__rate_interval": "1m", "$__range_s": "300", "$__range": "5m"}
REPEATS = 5


class _Nodes(ThreadingHTTPServer):
    """Serves ``/node/<n>``: the exposition of the current scrape, as node ``n``'s."""

    daemon_threads = True

    def __init__(self, bodies: list[bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies = bodies
        self.start = time.monotonic()

    def body(self, node: str) -> bytes:
        i = int((time.monotonic() - self.start) / INTERVAL_S) % len(self.bodies)
        text = self.bodies[i].replace(b'hostname="node-a"', f'hostname="{node}"'.encode())
        return text.replace(b'pod="', f'pod="{node}-'.encode())


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        node = self.path.rsplit("/", 1)[-1]
        body = self.server.body(node)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def prometheus_version() -> str:
    """``prometheus X.Y.Z`` as the installed binary names itself."""
    import subprocess

    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    words = (out.stdout or out.stderr).split()  # prometheus, version X.Y.Z ...
    return f"prometheus {words[2]}" if len(words) > 2 else "prometheus"


def _recorded() -> dict[str, str]:
    """Each recording rule's name and expression, from alerts/'s generated rule files."""
    out = {}
    for name in RULE_FILES[:2]:
        for group in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]:
            out |= {r["record"]: r["expr"] for r in group["rules"] if "record" in r}
    return out


def inline(expr: str, recorded: dict[str, str]) -> str:
    """``expr`` with every recorded series (and its selector) replaced by its rule's expression,
    until none is left (a range over one becomes a subquery at the evaluation interval): what
    the query costs without the recording rules."""
    names = "|".join(map(re.escape, recorded))
    pattern = re.compile(r"\b(" + names + r")\b(\{[^}]*\})?(\[[^\]:]+\])?")

    def expand(m: re.Match[str]) -> str:
        body = f"({recorded[m.group(1)].strip()})"
        return body + (f"{m.group(3)[:-1]}:{INTERVAL_S}s]" if m.group(3) else "")

    for _ in range(5):
        expr, n = pattern.subn(expand, expr)
        if not n:
            break
    return expr


def _inlined_rules(path: Path) -> None:
    """The recording rules with what each reads from other rules inlined, renamed."""
    recorded = _recorded()
    groups = []
    for name in RULE_FILES[:2]:
        for group in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]:
            rules = [
                {"record": f"inlined_{r['record']}", "expr": inline(r["expr"], recorded)}
                for r in group["rules"]
                if "record" in r
            ]
            if rules:
                groups.append({"name": f"inlined-{group['name']}", "rules": rules})
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))


def _config(path: Path, port: int, nodes: int, rules: list[Path]) -> None:
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {
                "__metrics_path__": f"/node/node-{n:03d}",
                "instance": f"node-{n:03d}",
                "node": f"node-{n:03d}",
                "cluster": "sim",
            },
        }
        for n in range(nodes)
    ]
    config = {
        "global": {"scrape_interval": f"{INTERVAL_S}s", "evaluation_interval": f"{INTERVAL_S}s"},
        "rule_files": [str(r) for r in rules],
        "scrape_configs": [
            {"job_name": "gpu-exporter", "honor_labels": True, "static_configs": targets}
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _dashboard_queries() -> dict[str, list[tuple[str, str]]]:
    """(title, expression) of the fleet dashboard: the fleet view, and the per-GPU row."""
    board = json.loads((ROOT / "dashboards" / "gpu-fleet.json").read_text())
    view: list[tuple[str, str]] = []
    per_gpu: list[tuple[str, str]] = []
    for panel in board["panels"]:
        view += [(panel["title"], t["expr"]) for t in panel.get("targets", [])]
        for inner in panel.get("panels", []):
            into = per_gpu if panel.get("collapsed") else view
            into += [(inner["title"], t["expr"]) for t in inner.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
            if m:  # the series a variable's values come from
                view.append((f"variable {var['name']}", f"count by ({m[2]}) ({m[1]})"))
    return {"view": view, "per_gpu": per_gpu}


def _substitute(expr: str) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    return re.sub(r'=~"\$\w+"', '=~".*"', expr)


def _timed(prom: Prometheus, expr: str) -> dict[str, float]:
    """Prometheus's evaluation time (ms, median of REPEATS) and samples of a range query."""
    end = time.time()
    params = {"query": expr, "start": end - 300, "end": end, "step": INTERVAL_S, "stats": "all"}
    times, samples = [], 0
    for _ in range(REPEATS):
        status, _, body = prom.get("/api/v1/query_range?" + urllib.parse.urlencode(params))
        assert status == 200, body
        data = json.loads(body)["data"]
        times.append(data["stats"]["timings"]["evalTotalTime"] * 1000)
        samples = data["stats"]["samples"]["totalQueryableSamples"]
    return {"ms": statistics.median(times), "samples": samples}


def _queries(prom: Prometheus) -> dict[str, Any]:
    recorded = _recorded()
    out: dict[str, Any] = {}
    for part, queries in _dashboard_queries().items():
        rows = [(t, _substitute(e)) for t, e in queries]
        out[part] = [{"title": t, **_timed(prom, e)} for t, e in rows]
        if part == "view":
            inlined = [(t, inline(e, recorded)) for t, e in rows]
            out["view_inlined"] = [{"title": t, **_timed(prom, e)} for t, e in inlined]
    return out


def _group_durations(prom: Prometheus, seconds: float) -> dict[str, float]:
    """Median of each rule group's last evaluation time (ms), read once per interval."""
    seen: dict[str, list[float]] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _, _, body = prom.get("/metrics")
        for m in re.finditer(
            r'^prometheus_rule_group_last_duration_seconds\{rule_group="[^;"]*;([^"]+)"\} (\S+)$',
            body.decode(),
            re.M,
        ):
            seen.setdefault(m[1], []).append(float(m[2]) * 1000)
        time.sleep(INTERVAL_S)
    return {group: round(statistics.median(v), 2) for group, v in sorted(seen.items())}


def measure(nodes: int = 100, minutes: float = 3.0) -> dict[str, Any]:
    """Rule groups' evaluation times, query times and head series over ``nodes`` nodes."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bodies = [e.body for e in capture(FLEETS / "default.yaml", FILES["default"], work, 30)]
        server = _Nodes(bodies)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        inlined = work / "inlined.rules.yaml"
        _inlined_rules(inlined)
        rules = [ROOT / "alerts" / name for name in RULE_FILES] + [inlined]
        _config(work / "prometheus.yml", server.server_address[1], nodes, rules)
        prom = Prometheus(work / "prometheus.yml", work)
        try:
            time.sleep(60)
            groups = _group_durations(prom, max(minutes * 60 - 60, INTERVAL_S * 2))
            _, _, own = prom.get("/metrics")
            head = re.search(rb"^prometheus_tsdb_head_series (\S+)$", own, re.M)
            series = {
                r["metric"]["__name__"]: float(r["value"][1])
                for r in prom.query('count by (__name__) ({__name__=~".+:.+"})')
            }
            return {
                "nodes": nodes,
                "interval_s": INTERVAL_S,
                "head_series": float(head[1]) if head else None,
                "recorded_series": sum(v for k, v in series.items() if "inlined_" not in k),
                "groups_ms": groups,
                "queries": _queries(prom),
            }
        finally:
            prom.stop()
            server.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.promfleet", description=__doc__)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--minutes", type=float, default=3.0)
    a = p.parse_args(argv)
    json.dump(measure(a.nodes, a.minutes), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
