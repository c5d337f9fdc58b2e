"""alerts/generate.py: the job and the runbook base of alerts/config.yaml reach every rule."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

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
