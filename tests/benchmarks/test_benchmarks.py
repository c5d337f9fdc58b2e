"""The benchmark suite runs end to end at tiny sizes, so it cannot rot. No timed assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from benchmarks import pods, report
from benchmarks.accounting import instrument
from benchmarks.fleets import tiny_mig
from exporter import sim

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    tmp = tmp_path_factory.mktemp("bench")
    out, raw = tmp / "benchmarks.md", tmp / "results.json"
    out.write_text("# Benchmarks\n\nIntro.\n\n## Image\n\nKept as it is.\n")
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--no-peer"]
    p = subprocess.run(
        [*argv, "--out", str(out), "--json", str(raw)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return out.read_text(), json.loads(raw.read_text())


def test_quick_run_writes_every_section_and_keeps_others(quick_run):
    text, _ = quick_run
    for heading in (
        "## This run",
        "## Targets",
        "## Collection cycle",
        "## Scrapes",
        "## Memory",
        "## Exposition",
        "## Growth",
        "## Scale curve",
        "## Pods",
        "## Side by side: nvitop-exporter",
    ):
        assert heading in text, heading
    assert text.count(report.END) == 1
    assert "## Image\n\nKept as it is." in text
    assert text.index("Intro.") < text.index(report.END) < text.index("## Image")
    assert "python -m benchmarks --quick --no-peer" in text
    assert "CPU at dcgm-exporter's default 30 s interval" in text
    assert "the floor (aiohttp alone)" in text


def test_quick_run_measures_what_the_issue_lists(quick_run):
    _, res = quick_run
    target = res["target"]
    cycle = res["cycle"][target]
    assert cycle["series"] > 0 and cycle["nvml_calls"] > 0
    assert 0 < cycle["gzip_bytes"] < cycle["plain_bytes"]
    assert cycle["cycle_cpu_ms"] > 0 and cycle["modelled_driver_ms"] > 0
    # the target node's cycle is measured three times over the run; its row is the least
    runs = res["cycle_target_runs"]
    assert len(runs) == 3 and cycle["net_ms"] == min(r["net_ms"] for r in runs)
    proc = res["process"][target]
    assert proc["rss_mib"] > 0
    got = {(r["scrapers"], r["gzip"]) for r in proc["scrapes"]}
    assert got == {(n, gz) for n in (1, 10) for gz in (True, False)}
    assert all(r["bytes"] > 0 and r["requests"] > 0 for r in proc["scrapes"])
    assert {(r["scrapers"], r["gzip"]) for r in proc["floor"]} == got
    assert all(r["p99_ratio"] > 0 and r["p50_ratio"] > 0 for r in proc["scrapes"])
    # CPU where users run it: 10 s and 30 s intervals, with pods, besides 1 s
    assert set(res["intervals"]) == {"10", "30"}
    assert all(v is not None and v >= 0 for v in res["intervals"].values())
    assert res["cpu_10s"] is not None
    for run in (res["churn"], res["churn_pods"]):
        assert run["reconfigs"] > 0 and run["last_ok"] and run["skipped"] == 0
        assert len(run["samples"]) >= 2
    assert res["churn_pods"]["attributed"] > 0 and res["churn_pods"]["pods_replaced"] > 0
    (with_pods,) = res["pods"].values()
    assert with_pods["attributed"] > 0
    assert set(res["scale_pods"]) == set(res["cycle"])
    assert all(r["attributed"] > 0 and r["rss_mib"] > 0 for r in res["scale_pods"].values())


def test_report_block_is_replaced_not_repeated(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\n## Image\n\nsize\n")
    report.write(doc, "## First\n\none")
    report.write(doc, "## Second\n\ntwo")
    text = doc.read_text()
    assert "## First" not in text and "## Second" in text
    assert text.count(report.END) == 1 and text.endswith("## Image\n\nsize\n")


def test_fit_recovers_a_line():
    a, b, r2 = report.fit([1, 8, 16, 64], [3 + 0.5 * x for x in (1, 8, 16, 64)])
    assert (round(a, 9), round(b, 9), round(r2, 9)) == (3.0, 0.5, 1.0)


def test_accounting_splits_modelled_cost_from_the_simulators_own(tmp_path):
    driver = sim.install(tiny_mig().mapping, clock=sim.ManualClock())
    try:
        acct = instrument(driver)
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMemoryInfo(h)
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()
    assert acct.calls["nvmlDeviceGetUtilizationRates"] == 1
    per_call = acct.modelled_by_function["nvmlDeviceGetUtilizationRates"]
    assert per_call == pytest.approx(driver.latency.cost_s("nvmlDeviceGetUtilizationRates"))
    assert acct.cpu_s > 0 and acct.overhead_s >= 0


def test_pods_take_one_device_each_then_none_and_come_back_renamed():
    ids = [f"MIG-{i}" for i in range(56)]
    listing = pods.assignments(ids, 60)["pod_resources"]
    devices = [c.get("devices") for p in listing for c in p["containers"]]
    assert [d[0]["device_ids"] for d in devices[:2]] == [["MIG-0"], ["MIG-1"]]
    assert devices[56:] == [None] * 4
    names = [p["name"] for p in pods.assignments(ids, 60, replaced=62)["pod_resources"]]
    assert names[:3] == ["bench-0000-g2", "bench-0001-g2", "bench-0002-g1"]


def test_profile_charges_structure_access_to_whoever_touched_it():
    from benchmarks.profile import _owner

    stack = ["collect", "fn (exporter/sim/library.py:1)", "_PrintableStructure.__setattr__ (x)"]
    assert _owner(stack) == "simulator (not on a real node)"
    ours = ["collect", "GpmReader._metrics (exporter/nvml/gpm.py:112)"]
    assert _owner([*ours, "_PrintableStructure.__getattribute__ (pynvml.py:1213)"]) == (
        "exporter: GpmReader._metrics"
    )
    assert _owner([*ours, "spin (exporter/sim/latency.py:48)"]) == (
        "driver calls (modelled busy-wait)"
    )


def test_quick_report_goes_outside_the_checkout(quick_run, tmp_path):
    _, res = quick_run
    raw = tmp_path / "results.json"
    raw.write_text(json.dumps(res))
    doc = ROOT / "docs" / "benchmarks.md"
    before = doc.read_bytes()
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--from-json", str(raw)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    written = Path(p.stdout.split("wrote ", 1)[1].split(" from ", 1)[0])
    assert ROOT not in written.resolve().parents
    assert "## Targets" in written.read_text()
    assert doc.read_bytes() == before


def test_memory_variants_block_is_kept_where_it_is(tmp_path):
    doc = tmp_path / "b.md"
    variants = "<!-- memory-variants:begin -->\n| variant | MiB |\n<!-- memory-variants:end -->"
    doc.write_text(f"# Benchmarks\n\n{report.BEGIN}\n\nold\n\n{variants}\n\n{report.END}\n")
    report.write(doc, "## New\n\nnumbers")
    report.write(doc, "## Newer\n\nnumbers")
    text = doc.read_text()
    assert "old" not in text and "## New\n" not in text and "## Newer" in text
    assert text.count(variants) == 1
    outside = tmp_path / "c.md"
    outside.write_text(f"# Benchmarks\n\n## Memory variants\n\n{variants}\n")
    report.write(outside, "## Run\n\nnumbers")
    report.write(outside, "## Run 2\n\nnumbers")
    assert outside.read_text().count(variants) == 1
    assert outside.read_text().endswith(f"{variants}\n")


def test_default_fleet_targets_when_measured(quick_run):
    _, res = quick_run
    t = res["target"]
    res = {
        **res,
        "cycle": {**res["cycle"], "default": res["cycle"][t]},
        "process": {**res["process"], "default": res["process"][t]},
        "fleets": {**res["fleets"], "default": res["fleets"][t]},
    }
    rows = {name: ok for name, _, ok in report.targets(res, report.derived(res))}
    cycle = res["cycle"]["default"]["net_ms"]
    assert rows["CPU per collection cycle ≤ 8 ms, default fleet"] == (cycle <= 8)
    assert "RSS ≤ 48 MiB, default fleet" in rows


def _bench(module: str, *args: str) -> dict:
    """The JSON a benchmark module prints, run as a user runs it on the default fleet."""
    got = subprocess.run(
        [sys.executable, "-m", module, "exporter/sim/fleets/default.yaml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout)


def test_publish_benchmark_renders_with_the_pods_it_was_given():
    res = _bench("benchmarks.publish", "--pods", "3", "--batches", "2")
    assert res["pods"] == 3 and res["render_ms"] > 0 and res["build_ms"] > 0
    assert 0 < res["gzip_bytes"] < res["plain_bytes"]
    # the publisher without pods took its turns on the same snapshots: no pod labels
    bare = res["without"]
    assert bare["render_ms"] > 0 and bare["plain_bytes"] < res["plain_bytes"]
    assert "pods_extra_ms" in res


def test_collisions_benchmark_tells_rounds_that_met_a_cycle_from_the_others():
    """At a 100 ms interval, cycles on the default fleet meet some of 150 rounds; the
    NVML worker found by its CPU is the thread whose time moves then."""
    res = _bench(
        "benchmarks.collisions", "--interval-ms", "100", "--rounds", "150", "--scrapers", "2"
    )
    met, other = res["met_cycle"], res["other"]
    assert met["rounds"] > 0 and other["rounds"] > 0
    assert met["rounds"] + other["rounds"] == 150
    assert 0 < met["p50_ms"] <= met["max_ms"]


def test_paired_runs_give_each_server_its_own_rounds(tmp_path):
    """Two floor servers with different bodies share one run: each result holds its own
    server's scrapes (by their body size), as many for both."""
    from benchmarks.load import scrape_pair
    from benchmarks.scrapes import floor_server

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        floor_server(tmp_path / "a", b"a" * 100, b"A" * 10) as port_a,
        floor_server(tmp_path / "b", b"b" * 300, b"B" * 30) as port_b,
    ):
        a, b = scrape_pair((port_a, port_b), 3, 30, 0.2, False)
    assert (a.requests, b.requests) == (30, 30)
    assert (a.body_bytes, b.body_bytes) == (100, 300)
