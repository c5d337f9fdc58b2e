"""A real Prometheus (Debian package) scrapes the exporter on the default simulated node."""

from __future__ import annotations

import pytest

from tests.procs import Exporter, Prometheus, require, wait_until


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


def test_scrape_is_clean(scraped):
    res = scraped.query('scrape_samples_post_metric_relabeling{job="gpu-exporter"}')
    assert float(res[0]["value"][1]) > 300
    # Prometheus parsed every sample: no exemplar or format errors show up as missing series
    assert scraped.query("gpu_exporter_gpus")[0]["value"][1] == "8"
