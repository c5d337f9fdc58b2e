"""A real Prometheus (Debian package) scrapes the exporter on the default simulated node."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.procs import ROOT, Exporter, Prometheus, require, wait_until


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    require("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("prom")
    exp = Exporter("-c", "300")
    exp.wait_ready()
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpu-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exp.port}']}}]\n"
    )
    prom = Prometheus(config, work)
    prom.exporter = exp
    try:
        wait_until(lambda: prom.query('up{job="gpu-exporter"} == 1'), 30, "a successful scrape")
        yield prom
    finally:
        prom.stop()
        exp.stop()


def test_gpu_util_for_each_non_mig_gpu(scraped):
    res = scraped.query("DCGM_FI_DEV_GPU_UTIL")
    assert sorted(r["metric"]["gpu"] for r in res) == ["0", "1", "2", "3", "4", "5"]
    for r in res:
        assert r["metric"]["modelName"] == "NVIDIA H100 80GB HBM3"
        assert 0 <= float(r["value"][1]) <= 100


def test_fb_used_for_each_mig_instance(scraped):
    res = scraped.query('DCGM_FI_DEV_FB_USED{GPU_I_ID!=""}')
    assert len(res) == 11
    assert {r["metric"]["gpu"] for r in res} == {"6", "7"}
    keys = {(r["metric"]["gpu"], r["metric"]["GPU_I_ID"]) for r in res}
    assert len(keys) == 11


def _per_device_series() -> tuple[int, int]:
    """README's series per whole H100 and per MIG instance (default metrics file, -d f)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"(\d+) per whole H100 \(fewer on GPUs that lack a field[^)]*\), (\d+)\s+per MIG", text
    )
    assert m, "README no longer states the series per device"
    return int(m.group(1)), int(m.group(2))


def test_scrape_is_clean(scraped):
    """Prometheus takes every sample the exporter serves: the DCGM series the fleet file
    and README's per-device counts give, plus the exporter's own samples."""
    fleet = yaml.safe_load((ROOT / "exporter" / "sim" / "fleets" / "default.yaml").read_text())
    whole = sum(1 for g in fleet["gpus"] if not g.get("mig"))
    instances = sum(len(g["mig"]) for g in fleet["gpus"] if g.get("mig"))
    assert (whole, instances) == (6, 11)
    per_gpu, per_instance = _per_device_series()
    served = [ln for ln in scraped.exporter.metrics().splitlines() if ln and ln[0] != "#"]
    dcgm = whole * per_gpu + instances * per_instance
    assert sum(ln.startswith("DCGM_") for ln in served) == dcgm
    own = sum(ln.startswith(("gpu_exporter_", "process_")) for ln in served)
    assert own == len(served) - dcgm  # nothing else is served
    for what in ("scrape_samples_scraped", "scrape_samples_post_metric_relabeling"):
        res = scraped.query(f'{what}{{job="gpu-exporter"}}')
        assert float(res[0]["value"][1]) == dcgm + own, what
    # Prometheus parsed every sample: no exemplar or format errors show up as missing series
    assert scraped.query("gpu_exporter_gpus")[0]["value"][1] == "8"
