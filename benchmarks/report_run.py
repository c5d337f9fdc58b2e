"""Report sections: how to run, this run, targets, collection cycle, scrapes."""

from __future__ import annotations

from typing import Any

from benchmarks.mdfmt import Add, _f, _net, _pod_rows, _row, _scrape, _verdict
from benchmarks.targets import interval_rates, targets
from exporter import __version__


def how_to_run(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's how to run section."""
    add("## How to run")
    add("")
    add("```sh")
    minutes = max(1, round(res["seconds"] / 60)) if not res["quick"] else "about 10"
    add(f"python -m benchmarks           # everything: {minutes} minutes here; rewrites this file")
    add("python -m benchmarks --quick   # seconds, tiny sizes; writes to the temp directory")
    add("```")
    add("")
    add(
        "`--no-peer` leaves nvitop-exporter out; `--out FILE` writes elsewhere; `--json FILE` "
        "keeps the raw results. The first full run creates `benchmarks/.venv-peer` with "
        "nvitop-exporter from PyPI."
    )
    add("")


def this_run(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's this run section."""
    m = res["machine"]
    add("## This run")
    add("")
    add(_row("", ""))
    add(_row("---", "---"))
    add(_row("command", f"`{res['command']}`"))
    add(_row("mode", "quick (tiny sizes: not comparable)" if res["quick"] else "full"))
    add(_row("date", m["date"]))
    add(_row("gpu-exporter", f"{__version__} at {m['commit']}"))
    add(_row("CPU", f"{m['cpu']}, {m['cores']} cores"))
    add(_row("memory", f"{m['memory_gib']} GiB"))
    add(_row("OS", m["kernel"]))
    add(_row("Python", m["python"]))
    add(_row("packages", ", ".join(f"{k} {v}" for k, v in m["packages"].items())))
    p = res.get("peer")
    if p and "version" in p:
        add(_row("peer", f"nvitop-exporter {p['version']} (own venv)"))
    la, lb = m["load_before"], m["load_after"]
    add(_row("load average", f"{la[0]:.2f} before, {lb[0]:.2f} after (1 min)"))
    add(_row("duration", f"{res['seconds']:.0f} s"))
    add("")
    add(
        "Every number comes from the simulated NVML driver with its latency model on "
        "(docs/simulator.md): each NVML call burns its published cost on the CPU, with the GIL "
        "released as a ctypes call into the driver does, so CPU figures "
        "include what the driver calls would cost. The simulator is Python, and its own "
        "bookkeeping is CPU a real `libnvidia-ml.so` would not spend: it is measured separately "
        "(benchmarks/accounting.py) and shown as *sim*; *net* is the exporter's own CPU plus "
        "the modelled cost of its calls, what a real node would see. Process-level figures "
        "(CPU %, RSS, scrape cost) include the simulator. The load average tells how busy the "
        "machine was with other work while this ran."
    )
    add("")


def targets_table(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's targets table section."""
    d = derived
    t = res["target"]
    add(f"## Targets ({t}, default metric set)")
    add("")
    add(_row("target", "measured", "verdict"))
    add(_row("---", "---", "---"))
    for name, measured, ok in targets(res, d):
        add(_row(name, measured, _verdict(ok)))
    add("")


def cycle(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's cycle section."""
    t = res["target"]
    fl = res["fleets"]
    add("## Collection cycle")
    add("")
    add(
        "In-process (benchmarks/cycle.py): `Collector.collect()` then `Poller.publish()` "
        "(render, self-metrics, plain and gzip bytes), sim time moved 1 s per cycle. "
        f"{res['sizes']['cycles']} cycles per pass in batches of 10; figures are per cycle, "
        "from the quietest batch (other work on the machine only ever adds CPU time). CPU % "
        "is the exporter process's own at `-c 1000`, no scrapes: its threads' on-CPU time in "
        "ns (/proc/PID/task/*/schedstat), not the process's 10 ms ticks."
    )
    add("")
    add(
        _row(
            "fleet",
            "GPUs",
            "MIG",
            "NVML calls",
            "measured CPU ms",
            "sim ms",
            "own ms",
            "publish ms",
            "driver ms",
            "**net ms**",
            "collect wall ms",
            "CPU % at 1 s",
        )
    )
    add(_row(*["---"] * 12))
    for n, c in res["cycle"].items():
        add(
            _row(
                n,
                fl[n]["gpus"],
                fl[n]["mig"],
                f"{c['nvml_calls']:.0f}",
                _f(c["cycle_cpu_ms"]),
                _f(c["sim_overhead_ms"]),
                _f(c["own_ms"]),
                _f(c["own_publish_ms"]),
                _f(c["modelled_driver_ms"]),
                f"**{_f(_net(c))}**",
                _f(c["collect_wall_ms"]),
                _f(res["process"][n]["cpu_1s"] * 100) if n in res["process"] else "",
            )
        )
    add("")
    tc = res["cycle"][t]
    add(
        "*measured* is the process's CPU per cycle (uninstrumented pass); the split comes from "
        "a second pass with the simulated library instrumented: *sim* the simulator's bookkeeping "
        "(library CPU less its modelled calls); *own* the CPU outside the simulated library: "
        "gpu-exporter and pynvml collecting, plus *publish* (render, self-metrics, gzip); "
        "*driver* the latency model's cost of the calls made (published per-call costs); "
        "**net** = own + driver, what the cycle costs on a real node. "
        f"On {t}, with the library instrumented: own {_f(tc['own_ms'])} ms (publish "
        f"{_f(tc['own_publish_ms'])}), simulator {_f(tc['sim_overhead_ms'])}, modelled calls "
        f"{_f(tc['spin_cpu_ms'])} (modelled {_f(tc['modelled_driver_ms'])}); net "
        f"{_f(_net(tc))} ms; net per batch of 10: "
        f"{', '.join(_f(v) for v in tc['net_batches_ms'])}. "
        + (
            f"At a 10 s interval the {t} process without pods uses "
            f"{_f(res['cpu_10s'] * 100)} % of a core."
            if res.get("cpu_10s") is not None
            else "The 10 s and 30 s intervals are measured in full runs only."
        )
    )
    add("")
    rates = interval_rates(res)
    if len(rates) > 1:
        n = _pod_rows(res)[1]["pods"]
        add(
            f"The {t} process with {n} pods at the intervals users run (`-c`; dcgm-exporter's "
            "default is 30 s): its CPU per second measured over three cycles, no scrapes, "
            "simulator included, and that CPU per cycle."
        )
        add("")
        add(_row("interval", "CPU per cycle ms", "% of a core"))
        add(_row("---", "---", "---"))
        for sec, rate in rates:
            add(_row(f"{sec} s", _f(rate * sec * 1e3), _f(rate * 100, 3)))
        add("")


def scrapes(add: Add, res: dict[str, Any], derived: dict[str, Any]) -> None:
    """The report's scrapes section."""
    t = res["target"]
    proc = res["process"][t]
    add(f"## Scrapes ({t})")
    add("")
    add(
        "N scrapers, each on its own keep-alive connection, fire at the same instant; "
        f"rounds are spread over {res['sizes']['spread_s']:g} s, each at a random point of its "
        "own slot, so they meet every phase of the 1 s collection cycle. "
        f"Each configuration runs {res['sizes'].get('repeats', 1)} times; the row is the run "
        "with the median p99 (all p99s in the last column). "
        "Latency is from sending the request to the last body byte, measured by the client "
        "(benchmarks/load.py), which shares the machine's cores. *server CPU* is the exporter "
        "process's CPU per scrape, less its idle rate. The floor server (benchmarks/floor.py) "
        "serves the same bytes with nothing but a socket write: the part of the latency no "
        "exporter change can remove. It shares each run with the exporter, their rounds "
        "taking turns within every slot, so both see the same machine load; the ratios "
        "compare the scrapes of all repeats pooled (exporter / floor)."
    )
    add("")
    add(
        _row(
            "scrapers",
            "encoding",
            "requests",
            "p50 ms",
            "p99 ms",
            "max ms",
            "server CPU µs",
            "floor p50 ms",
            "floor p99 ms",
            "p50 / floor",
            "p99 / floor",
            "p99 of each run ms",
        )
    )
    add(_row(*["---"] * 12))
    for r in proc["scrapes"]:
        fr = _scrape(proc.get("floor", []), r["scrapers"], r["gzip"])
        add(
            _row(
                r["scrapers"],
                "gzip" if r["gzip"] else "plain",
                r["requests"],
                _f(r["p50_ms"]),
                _f(r["p99_ms"]),
                _f(r["max_ms"]),
                _f(r["server_cpu_us"], 0),
                _f(fr["p50_ms"]) if fr else "",
                _f(fr["p99_ms"]) if fr else "",
                f"{r['p50_ratio']:.2f}x" if "p50_ratio" in r else "",
                f"{r['p99_ratio']:.2f}x" if "p99_ratio" in r else "",
                ", ".join(_f(v) for v in r.get("p99_repeats_ms", [])),
            )
        )
    add("")
