"""Container and HPC job copies under their budget: containers holding every GPU, each GPU
with jobs, must not multiply into a million series (the red team's 938,002 series and
1.5 GiB RSS for 1,024 containers); what is left out is counted and named once. The
exposition test is sized so that a build without the budget fails in seconds (about
400,000 series), not by exhausting memory; the red team's size is checked on the copies."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from exporter import sim
from exporter.catalog.metricsfile import load
from exporter.collector import Collector
from exporter.config.model import Config, default_metrics_file
from exporter.exposition import jobs as copies_of
from exporter.exposition.jobs import MAX_COPIES
from exporter.poller import Poller
from exporter.workloads.containers import Holding
from exporter.workloads.hpcjobs import MAX_JOBS
from tests.support.exposition import find, samples

CATALOG = load(default_metrics_file())


@pytest.fixture
def node(tmp_path):
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    poller = Poller(CATALOG, col, 1.0, 1.0, cfg=Config(hpc_job_dir=str(tmp_path)))
    try:
        yield tmp_path, col, poller
    finally:
        col.close(0.5)
        poller.close()
        sim.uninstall()


def cycle(col: Collector, poller: Poller) -> str:
    poller.publish(col.collect())
    return poller.builder.dcgm_text + poller.selfmetrics.render().decode()


def test_copies_of_every_container_and_job_are_bounded(node, caplog):
    jobs, col, poller = node
    plain = cycle(col, poller)
    gpus = sorted({s.labels["gpu"] for s in find(plain, "DCGM_FI_DEV_GPU_TEMP")})
    per_copy = len([s for s in samples(plain) if s.labels.get("gpu") == "0"])
    holdings = tuple(Holding(f"c{i:04}", ("all",)) for i in range(64))
    poller.runtime = SimpleNamespace(held=holdings)  # what the runtime client answered
    for g in gpus:
        (jobs / g).write_text("".join(f"j{k}\n" for k in range(8)))
    with caplog.at_level(logging.WARNING):
        text = cycle(col, poller)
        again = cycle(col, poller)
    # every GPU keeps copies, none more than the budget's share; the first ones kept
    temps = find(text, "DCGM_FI_DEV_GPU_TEMP")
    assert {s.labels["gpu"] for s in temps} == set(gpus)
    assert len({(s.labels["gpu"], s.labels.get("GPU_I_ID")) for s in temps}) >= len(gpus)
    assert len(temps) <= MAX_COPIES
    gpu0 = find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert gpu0[0].labels["hpc_job"] == "j0" and "container" not in gpu0[0].labels
    assert len(samples(text)) < 2 * MAX_COPIES * per_copy  # not 65 x 8 x 8 x fields
    dropped = next(s for s in samples(again) if s.name == "gpu_exporter_series_copies_dropped")
    assert dropped.value > 65 * 8  # at least one GPU's worth
    lines = [r.getMessage() for r in caplog.records if "over the budget" in r.getMessage()]
    assert len(lines) == 1 and "device 0" in lines[0]  # named once, not every cycle


def test_copies_under_the_budget_are_all_kept(node):
    jobs, col, poller = node
    poller.runtime = SimpleNamespace(held=(Holding("a", ("0",)), Holding("b", ("0",))))
    (jobs / "0").write_text("1\n2\n")
    text = cycle(col, poller)
    got = sorted(
        (s.labels.get("container", ""), s.labels["hpc_job"])
        for s in find(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")
    )
    assert got == [("", "1"), ("", "2"), ("a", "1"), ("a", "2"), ("b", "1"), ("b", "2")]
    dropped = next(s for s in samples(text) if s.name == "gpu_exporter_series_copies_dropped")
    assert dropped.value == 0


def test_the_red_team_size_is_bounded_in_the_copies():
    """1,024 containers on every GPU, each GPU with 64 jobs: 256 label sets in all, the
    rest (8 x 65,600 - 256) counted, and no more label text built than is kept."""
    sim.install(None, latency=False)
    col = Collector(CATALOG, "node-a")
    try:
        snap = col.collect()
    finally:
        col.close(0.5)
        sim.uninstall()
    gpus = snap.gpus
    names = tuple(f"c{i:04}" for i in range(1024))
    job_ids = tuple(f"j{k}" for k in range(MAX_JOBS))
    out, dropped = copies_of.copies(
        gpus,
        {g.key: f'gpu="{g.index}"' for g in gpus},
        None,
        {g.key: job_ids for g in gpus},
        {g.key: names for g in gpus},
    )
    assert sum(len(v) for v in out.values()) <= MAX_COPIES
    assert all(len(out[g.key]) == MAX_COPIES // len(gpus) for g in gpus)
    assert sum(dropped.values()) == len(gpus) * (1025 * MAX_JOBS) - MAX_COPIES
    assert out[gpus[0].key][0] == 'gpu="0",hpc_job="j0"'
