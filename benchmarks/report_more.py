"""Report sections: memory, exposition, growth, pods, side by side with nvitop-exporter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import scale
from benchmarks.mdfmt import Add, _f, _growth, _kib, _net, _pod_rows, _row, _scrape
from benchmarks.targets import peer_neighbour


def memory(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's memory section."""
    d = derived
    t = res["target"]
    add("## Memory")
    add("")
    add(_row("fleet", "RSS after warm-up MiB", "after the scrape runs MiB"))
    add(_row("---", "---", "---"))
    for n, pr in res["process"].items():
        add(_row(n, _f(pr["rss_mib"], 1), _f(pr["rss_after_scrapes_mib"], 1)))
    add("")
    ch = res["churn"]
    grow, slope = d["churn_total"]
    add(
        f"**Churn** (benchmarks/churn.py, {t}): the real application (aiohttp server, poller, "
        f"collector) runs {ch['cycles']:,} cycles back to back after {ch['warmup']} of warm-up; "
        f"every {res['sizes']['churn_every']} cycles one MIG GPU is reconfigured (seven 1g.10gb "
        "<-> 3g.40gb + 2g.20gb + 2x 1g.10gb, new UUIDs each time), "
        f"{ch['reconfigs']:,} reconfigurations in all. Latency model off (it only burns CPU). "
        "A second run does the same with `-k` and the stand-in kubelet listing "
        f"{res.get('churn_pods', {}).get('pods', 0)} pods that follow the MIG layouts, a tenth "
        "of them replaced by new pods every 10 cycles. The two run side by side."
    )
    add("")
    add(_row("cycles", *[f"{c:,}" for c, _ in ch["samples"]]))
    add(_row(*["---"] * (len(ch["samples"]) + 1)))
    add(_row("RSS MiB", *[_f(mb, 1) for _, mb in ch["samples"]]))
    cp = res.get("churn_pods")
    if cp and len(cp["samples"]) == len(ch["samples"]):
        add(_row(f"with {cp['pods']} pods", *[_f(mb, 1) for _, mb in cp["samples"]]))
    add("")
    if cp:
        g2, s2 = _growth(cp["samples"])
        add(
            f"With pods: {g2:+.2f} MiB ({s2:+.3f} MiB per 1,000 cycles), "
            f"{cp['pods_replaced']:,} pods replaced, {cp['attributed']:,} series with a pod "
            "label at the end."
        )
        add("")
    add(
        f"Growth {grow:+.2f} MiB ({slope:+.3f} MiB per 1,000 cycles). At the end "
        f"{ch['live_mig']} MIG instances were live; the exporter's enumerator held "
        f"{ch['exporter_mig_devices_held']:,} MIG devices and the simulator "
        f"{ch['sim_handles_held']:,} handles. {_f(ch['cpu_ms_per_cycle'])} ms CPU per cycle."
    )
    tr = res.get("churn_trace")
    if tr and tr.get("trace_top"):
        add("")
        add(
            f"Heap growth by file over {tr['cycles']} churn cycles ({tr['reconfigs']} "
            "reconfigurations; tracemalloc, started after warm-up, so the current exposition "
            "shows up once in poller.py and exposition/build.py):"
        )
        add("")
        add(_row("file", "growth"))
        add(_row("---", "---"))
        for f, size in tr["trace_top"]:
            add(_row(f"`{f}`", _kib(size)))
    add("")


def exposition(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's exposition section."""
    add("## Exposition")
    add("")
    add(_row("fleet", "DCGM series", "lines", "plain", "gzip"))
    add(_row("---", "---", "---", "---", "---"))
    for n, c in res["cycle"].items():
        add(
            _row(
                n,
                f"{c['series']:,}",
                f"{c['lines']:,}",
                _kib(c["plain_bytes"]),
                _kib(c["gzip_bytes"]),
            )
        )
    add("")


def growth(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's growth section."""
    d = derived
    add("## Growth")
    add("")
    add("Least-squares fits over the whole-GPU fleets (y = a + b x, x = GPUs) unless noted.")
    add("")
    add(_row("quantity", "slope", "intercept", "R²"))
    add(_row("---", "---", "---", "---"))

    def fitrow(label: str, key: str, unit: str, digits: int = 3) -> None:
        if key in d:
            a, b, r2 = d[key]
            add(_row(label, f"{b:,.{digits}f} {unit} per GPU", f"{a:,.{digits}f}", f"{r2:.3f}"))

    fitrow("cycle CPU", "cpu_per_gpu", "ms")
    fitrow("cycle CPU, net", "net_per_gpu", "ms")
    if "cpu_per_mig" in d:
        v, n, base = d["cpu_per_mig"]
        add(_row(f"cycle CPU per MIG instance ({n} vs {base})", f"{v:.3f} ms", "", ""))
        v, n, base = d["net_per_mig"]
        add(_row("cycle CPU per MIG instance, net", f"{v:.3f} ms", "", ""))
    if "cpu_gpu_mig" in d:
        a, b, c, r2 = d["cpu_gpu_mig"]
        add(
            _row(
                "cycle CPU, net, all fleets: a + b GPUs + c MIG instances",
                f"b {b:.3f} ms per GPU, c {c:.3f} ms per MIG instance",
                f"{a:.3f}",
                f"{r2:.3f}",
            )
        )
    fitrow("DCGM series", "series_per_gpu", "series", 1)
    fitrow("exposition, plain", "bytes_per_gpu", "bytes", 0)
    fitrow("exposition, gzip", "gzip_per_gpu", "bytes", 0)
    fitrow("RSS after warm-up", "rss_per_gpu", "MiB")
    fitrow("scrape p50, 10 scrapers, gzip", "scrape_p50_gzip", "ms", 4)
    fitrow("scrape p50, 10 scrapers, plain", "scrape_p50_plain", "ms", 4)
    fitrow("server CPU per scrape, gzip", "scrape_cpu_gzip", "µs", 2)
    fitrow("server CPU per scrape, plain", "scrape_cpu_plain", "µs", 2)
    for label, key, unit, k, digits in (
        ("process CPU per cycle at 1 s", "cpu_per_pod", "µs", 1e3, 2),
        ("RSS after warm-up", "rss_per_pod", "KiB", 1024, 1),
        ("exposition, plain", "bytes_per_pod", "bytes", 1, 1),
    ):
        if key in d:
            a, b, r2 = d[key]
            add(
                _row(
                    f"{label}, x = pods",
                    f"{b * k:,.{digits}f} {unit} per pod",
                    f"{a:,.3f}",
                    f"{r2:.3f}",
                )
            )
    add("")
    add(
        _row(
            "fleet",
            "10 scrapers gzip p50 / p99 ms",
            "plain p50 / p99 ms",
            "server CPU µs gzip / plain",
        )
    )
    add(_row("---", "---", "---", "---"))
    for n, pr in res["process"].items():
        g, pl = _scrape(pr["scrapes"], 10, True), _scrape(pr["scrapes"], 10, False)
        if g and pl:
            add(
                _row(
                    n,
                    f"{_f(g['p50_ms'])} / {_f(g['p99_ms'])}",
                    f"{_f(pl['p50_ms'])} / {_f(pl['p99_ms'])}",
                    f"{_f(g['server_cpu_us'], 0)} / {_f(pl['server_cpu_us'], 0)}",
                )
            )
    add("")

    for line in scale.section(res):
        add(line)


def pods(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's pods section."""
    t = res["target"]
    add(f"## Pods ({t})")
    add("")
    pod_rows = _pod_rows(res)
    if not pod_rows:
        add("Not measured.")
    else:
        add(
            "`-k` against benchmarks/kubelet.py, a stand-in kubelet serving pod-resources `List` "
            "on a unix socket from its own process. The first pods hold one GPU device each "
            "(the node's MIG instances), the rest none, as CPU pods on a dense node: every pod "
            "is in the kubelet's answer the exporter reads each cycle (benchmarks/pods.py). "
            "0 pods is the run without `-k`. Time-sliced sharing is not measured: its "
            "per-container split needs the API server and the host's /proc."
        )
        add("")
        add(
            _row(
                "pods",
                "series with a pod label",
                "DCGM series",
                "plain",
                "gzip",
                "RSS MiB",
                "CPU % at 1 s",
                "10 scrapers gzip p50 / p99 ms",
                "server CPU µs",
            )
        )
        add(_row(*["---"] * 9))
        for r in pod_rows:
            g = _scrape(r["scrapes"], 10, True)
            add(
                _row(
                    f"{r['pods']:,}",
                    f"{r['attributed']:,}",
                    f"{r['series']:,}" if r["series"] is not None else "",
                    _kib(r["plain_bytes"]),
                    _kib(r["gzip_bytes"]),
                    _f(r["rss_mib"], 1),
                    _f(r["cpu_1s"] * 100),
                    f"{_f(g['p50_ms'])} / {_f(g['p99_ms'])}" if g else "",
                    _f(g["server_cpu_us"], 0) if g else "",
                )
            )
    add("")


def peer(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's peer section."""
    d = derived
    t = res["target"]
    p = res.get("peer")
    add(f"## Side by side: nvitop-exporter ({t})")
    add("")
    if not p:
        add("Not run (`--no-peer`, or `--quick` without `--peer`).")
    elif "error" in p:
        add(f"Not run: {p['error']}")
    else:
        _peer_section(add, res, p, d)
    add("")


def _peer_section(add: Any, res: dict[str, Any], p: dict[str, Any], d: dict[str, Any]) -> None:
    t = res["target"]
    ours_c, ours_p = peer_neighbour(res), res["process"][t]
    pc = p["cycle"]
    add(
        "Same simulated driver, same fleet, same latency model, same client. nvitop-exporter "
        "collects on an interval (`--interval 1`) like gpu-exporter, in its main thread; "
        "unlike gpu-exporter it renders the exposition on every scrape (prometheus-client, "
        "HTTP/1.0, a thread per request), so its scrape cost is its own row. Its cycle is "
        "measured in-process the same way as ours (benchmarks/peer_cycle.py: the body of its "
        "collect loop, `update_host()` and `update_device()` for each of its "
        f"{pc['devices']} devices)."
    )
    add("")
    add(_row("", "gpu-exporter", "nvitop-exporter", "nvitop / ours"))
    add(_row("---", "---", "---", "---"))

    def ratio(a: float | None, b: float | None) -> str:
        if a is None or b is None or b == 0:
            return "n/a"
        return f"{a / b:.1f}x"

    def compare(label: str, ours: float, theirs: float, show: Callable[[float], str] = _f) -> None:
        add(_row(label, show(ours), show(theirs), ratio(theirs, ours)))

    for label, ours, theirs, show in (
        ("CPU per cycle, as measured, ms", ours_c["cycle_cpu_ms"], pc["cycle_cpu_ms"], _f),
        ("**CPU per cycle, net** (own + modelled driver), ms", _net(ours_c), _net(pc), _f),
        ("of which modelled driver calls, ms", ours_c["modelled_driver_ms"],
         pc["modelled_driver_ms"], _f),
        ("NVML calls per cycle", ours_c["nvml_calls"], pc["nvml_calls"], "{:.0f}".format),
        ("cycle wall time, ms", ours_c["collect_wall_ms"], pc["collect_wall_ms"], _f),
        ("process CPU at a 1 s interval, % of a core", ours_p["cpu_1s"], p["cpu_1s"],
         lambda v: _f(v * 100)),
        ("RSS after warm-up, MiB", ours_p["rss_mib"], p["rss_mib"], lambda v: _f(v, 1)),
    ):  # fmt: skip
        compare(label, ours, theirs, show)
    add(_row("series", f"{ours_c['series']:,}", f"{pc['series']:,}", ""))
    add(_row("exposition, plain", _kib(ours_c["plain_bytes"]), _kib(pc["plain_bytes"]), ""))
    add(
        _row(
            "render CPU, ms",
            f"{_f(ours_c['publish_cpu_ms'])} per cycle",
            f"{_f(pc['render_cpu_ms'])} per scrape",
            "",
        )
    )
    idle = p.get("scrapes_idle", [])
    for r in p["scrapes"]:
        o = _scrape(ours_p["scrapes"], r["scrapers"], r["gzip"])
        if o is None:
            continue
        q = _scrape(idle, r["scrapers"], r["gzip"])
        enc = "gzip" if r["gzip"] else "plain"
        who = f"{r['scrapers']} scraper" + ("s" if r["scrapers"] > 1 else "")
        for stat in ("p50", "p99"):
            key = f"{stat}_ms"
            label = f"scrape {stat}, {who}, {enc}, ms"
            compare(label, o[key], r[key])
            if q:
                compare(f"{label}, its collector idle (`--interval 60`)", o[key], q[key])
        if q:
            label = f"server CPU per scrape, {who}, {enc}, µs (its collector idle)"
            compare(label, o["server_cpu_us"], q["server_cpu_us"], lambda v: _f(v, 0))
    add("")
    top = ", ".join(f"`{k}` {v:.1f} ms" for k, v in pc["modelled_by_function_ms"].items())
    need = pc["cycle_cpu_ms"] / 1e3
    if need > 0.8:
        add(
            f"nvitop-exporter needs {need:.2f} s of CPU per cycle, so at `--interval 1` it "
            "collects back to back and its process CPU is whatever share of a core the machine "
            "gives it (see the load average): the per-cycle row is the comparable one."
        )
        add("")
    add(
        f"Where nvitop-exporter's modelled driver time goes per cycle: {top}. The process lists "
        f"({_f(d['peer_plist_ms'], 1)} ms) feed its per-process metrics, which gpu-exporter does "
        "not export; without them it would still use "
        f"{d['peer_no_plist_ratio']:.1f}x our net CPU per cycle. It enumerates devices once at "
        "start, so it does not see MIG layouts change; gpu-exporter re-enumerates every cycle "
        "and still uses less."
    )
