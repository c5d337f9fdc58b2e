"""The copies of alerts/ and dashboards/ in deploy/base/generated/, and the README's install
kustomization: current, equal to their sources, and rendered as the sidecar loads them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from exporter import __version__
from tests.deploy.conftest import DEPLOY
from tests.deploy.test_manifests import NO_OPERATOR, _container, _kind, _one
from tests.procs import ROOT, require

# Copies of alerts/ and dashboards/


def test_generated_copies_are_current():
    p = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr


def test_deployed_rules_are_the_alerts_prometheusrule(rendered):
    source = next(
        d for d in yaml.safe_load_all((ROOT / "alerts" / "prometheusrule.yaml").read_text()) if d
    )
    for name, objs in rendered.items():
        if name == NO_OPERATOR:
            assert not _kind(objs, "PrometheusRule")
            continue
        deployed = _one(objs, "PrometheusRule")
        assert deployed["spec"] == source["spec"], name
        assert deployed["metadata"]["name"] == source["metadata"]["name"]
        assert source["metadata"]["labels"].items() <= deployed["metadata"]["labels"].items()


def test_deployed_dashboards_are_the_dashboards(rendered):
    sources = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert sources, "no dashboards/*.json"
    for name, objs in rendered.items():
        maps = [
            m
            for m in _kind(objs, "ConfigMap")
            if m["metadata"]["labels"].get("grafana_dashboard") == "1"
        ]
        deployed = {k: v for m in maps for k, v in m["data"].items()}
        assert deployed == sources, name
        for m in maps:
            (text,) = m["data"].values()
            json.loads(text)
            assert "${DS_" not in text, "the sidecar substitutes no import placeholder"
            notes = m["metadata"]["annotations"]
            assert notes["grafana_folder"] == notes["k8s-sidecar-target-directory"] == "GPU"
            assert len(text.encode()) < 900_000, "a ConfigMap holds at most 1 MiB"


def test_the_readmes_install_kustomization_renders(tmp_path):
    """README, "Install on a cluster": the kustomization it writes, beside a deploy/ folder."""
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"cat > (\S+)/kustomization.yaml <<'EOF'\n(.*?)\nEOF\n", readme, re.S)
    assert m, "no kustomization in the README's install section"
    (tmp_path / "deploy").symlink_to(DEPLOY)
    site = tmp_path / m.group(1)
    site.mkdir()
    (site / "kustomization.yaml").write_text(m.group(2) + "\n")
    kubectl = require("kubectl", "kubectl (1.27 or newer, with kustomize)")
    p = subprocess.run([kubectl, "kustomize", str(site)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    objs = [o for o in yaml.safe_load_all(p.stdout) if o]
    assert _container(objs)["image"] == f"registry.example.com/gpu-exporter:{__version__}"
    assert _one(objs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
