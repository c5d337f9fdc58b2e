"""alerts/generate.py: the job and the runbook base of alerts/config.yaml reach every rule."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"

_spec = importlib.util.spec_from_file_location("alerts_generate", ALERTS / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

OWN = re.compile(r"(?<![\w:\"])(DCGM_\w+|gpu_exporter_\w+|up)\b(\{[^}]*\})?")


def test_generated_files_are_current():
    p = subprocess.run(
        [sys.executable, str(ALERTS / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr


def test_select_job_adds_the_matcher_to_every_own_selector():
    expr = (
        'sum by (job, node) (DCGM_FI_DEV_FB_USED{pod!=""} + DCGM_FI_DEV_FB_FREE)'
        " and on(job, instance) (up == 1) unless gpu_exporter_gpus offset 5m"
        ' and kube_node_status_capacity{resource="nvidia_com_gpu"} and node:gpu_x:sum'
    )
    out = gen.select_job(expr, "a|b")
    assert out == (
        'sum by (job, node) (DCGM_FI_DEV_FB_USED{job=~"a|b", pod!=""}'
        ' + DCGM_FI_DEV_FB_FREE{job=~"a|b"}) and on(job, instance) (up{job=~"a|b"} == 1)'
        ' unless gpu_exporter_gpus{job=~"a|b"} offset 5m'
        ' and kube_node_status_capacity{resource="nvidia_com_gpu"} and node:gpu_x:sum'
    )


def test_every_rule_reads_the_configured_job_only():
    cfg = gen.load_config()
    for name in gen.SOURCES:
        for group in yaml.safe_load((ALERTS / name).read_text())["groups"]:
            for rule in group["rules"]:
                for m in OWN.finditer(rule["expr"]):
                    assert m.group(2) and f'job=~"{cfg["job"]}"' in m.group(2), (
                        rule.get("alert") or rule.get("record"),
                        m.group(0),
                    )


def test_a_changed_setting_reaches_every_alert_and_the_prometheusrule():
    cfg = {"job": "gpu-exporter|dcgm", "runbook_url_base": "https://runbooks.example.org/gpu"}
    manifest = yaml.safe_load(gen.render(cfg=cfg).split("---\n", 1)[1])
    alerts = [r for g in manifest["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url == f"https://runbooks.example.org/gpu/{rule['alert']}.md"
        assert (REPO / "docs" / "runbooks" / f"{rule['alert']}.md").is_file()
    assert 'up{job=~"gpu-exporter|dcgm"} == 0' in gen.render_rules("gpu-alerts.rules.yaml", cfg=cfg)


def test_the_templates_leave_job_and_runbooks_to_the_generator():
    for name in gen.SOURCES:
        text = (ALERTS / "src" / name).read_text()
        assert "runbook_url" not in text.split("groups:", 1)[1], name
        assert "job=" not in text and "job!" not in text, name


def test_the_default_runbooks_are_this_repositorys():
    """The default base is docs/runbooks of the repository the image names as its source."""
    dockerfile = (REPO / "Dockerfile").read_text()
    (source,) = re.findall(r'org\.opencontainers\.image\.source="([^"]+)"', dockerfile)
    assert gen.load_config()["runbook_url_base"] == f"{source}/blob/main/docs/runbooks"


def test_once_per_gpu_splits_whole_gpus_from_mig_copies():
    out = gen.once_per_gpu("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0")
    whole, mig = out.split("\nor\n")
    assert 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{GPU_I_ID=""}[10m]' in whole
    assert mig.startswith(f"max by ({gen.GPU_LABELS}) (")
    assert 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{GPU_I_ID!=""}[10m]' in mig
    assert "pod" not in mig and "GPU_I_PROFILE" not in mig
    kept = gen.once_per_gpu('label_replace(DCGM_FI_DEV_X{a="b"}, "t", "v", "", "")', ("t",))
    assert f"max by ({gen.GPU_LABELS}, t) (" in kept
    assert 'DCGM_FI_DEV_X{GPU_I_ID!="", a="b"}' in kept


def _device_level() -> set[str]:
    from exporter.nvml.fields import FIELDS, Scope

    return {name for name, field in FIELDS.items() if field.scope == Scope.DEVICE}


def test_every_alert_on_a_device_level_field_fires_once_per_gpu():
    """An alert reading a device-level field is marked once_per_gpu, or reads whole GPUs only.

    On a MIG GPU under -d f such a field repeats per GPU instance: unmarked, the alert
    would fire once per instance.
    """
    device = _device_level()
    src = yaml.safe_load((ALERTS / "src" / "gpu-alerts.rules.yaml").read_text())["groups"]
    unmarked = []
    for rule in (r for g in src for r in g["rules"] if "alert" in r and "once_per_gpu" not in r):
        for m in OWN.finditer(rule["expr"]):
            if m.group(1) in device and 'GPU_I_ID=""' not in (m.group(2) or ""):
                unmarked.append((rule["alert"], m.group(0)))
    assert unmarked == []


def _priced_cfg(by_model: dict[str, float]) -> dict:
    return {
        "job": "gpu-exporter",
        "runbook_url_base": "https://runbooks.example.org/gpu",
        "gpu_hour_price": 2.0,
        "gpu_hour_price_by_model": by_model,
    }


def test_gpu_hours_are_priced_per_model_when_listed(tmp_path: Path, promtool: str) -> None:
    """An H100 priced at 4 a GPU-hour, everything else at the default 2: promtool checks
    the generated cost rule on an hour of each (and a model name with a quote)."""
    cfg = _priced_cfg({"NVIDIA H100 80GB HBM3": 4.0, 'Odd "GPU"': 9.0})
    (tmp_path / "rules.yaml").write_text(gen.render_rules("gpu-accounting.rules.yaml", cfg=cfg))
    held = 'gpu_exporter_allocated_gpu_seconds_total{job="gpu-exporter", namespace="ml", '
    cost, price = "namespace_pod:gpu_cost:increase1h", "model_name:gpu_hour_price:config"
    tests = {
        "interval": "1m",
        "input_series": [
            {"series": held + f'pod="{pod}", model_name="{model}"}}', "values": "0+60x60"}
            for pod, model in (("a", "NVIDIA H100 80GB HBM3"), ("b", "NVIDIA A100-SXM4-40GB"))
        ],
        "promql_expr_test": [
            {
                "expr": cost,
                "eval_time": "1h",
                "exp_samples": [
                    {"labels": cost + '{namespace="ml", pod="a"}', "value": 4},
                    {"labels": cost + '{namespace="ml", pod="b"}', "value": 2},
                ],
            },
            {
                "expr": price,
                "eval_time": "1m",
                "exp_samples": [
                    {"labels": price + '{model_name="NVIDIA H100 80GB HBM3"}', "value": 4},
                    {"labels": price + '{model_name="Odd \\"GPU\\""}', "value": 9},
                ],
            },
        ],
    }
    case = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [tests]}
    (tmp_path / "cost.test.yaml").write_text(yaml.safe_dump(case))
    p = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "cost.test.yaml")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_without_per_model_prices_there_is_no_price_table() -> None:
    text = gen.render_rules("gpu-accounting.rules.yaml", cfg=_priced_cfg({}))
    assert "gpu_hour_price:config" not in text and "price_table" not in text
    assert ") * 2.0" in text


def test_a_bad_price_is_refused_naming_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    base = "job: gpu-exporter\nrunbook_url_base: https://example.org\n"
    for line, name in (
        ("gpu_hour_price: cheap\n", "gpu_hour_price"),
        ("gpu_hour_price: -1\n", "gpu_hour_price"),
        ("gpu_hour_price_by_model: [4]\n", "gpu_hour_price_by_model"),
        ("gpu_hour_price_by_model: {H100: x}\n", "gpu_hour_price_by_model['H100']"),
    ):
        bad.write_text(base + line)
        with pytest.raises(SystemExit, match=re.escape(name)):
            gen.load_config(bad)
