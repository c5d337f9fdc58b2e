"""docs/deploy.md against the rendered manifests: its platform table, its kustomization
example, and each statement of a value (resources, tolerations, labels, verbs, intervals)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from exporter import __version__
from tests.deploy.conftest import COMPONENTS, DEPLOY
from tests.procs import ROOT, require

DOC = (ROOT / "docs" / "deploy.md").read_text()


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind]
    return found


def _pod(objs):
    return _one(objs, "DaemonSet")["spec"]["template"]["spec"]


def _platforms() -> dict[str, list[str]]:
    block = DOC.split("<!-- platforms:begin -->")[1].split("<!-- platforms:end -->")[0]
    rows = [r.strip().strip("|").split("|") for r in block.strip().splitlines()[2:]]
    return {p.strip(): [c.strip() for c in cs.split(",") if c.strip() != "none"] for p, cs in rows}


def test_platform_table_names_every_component_and_only_those():
    named = {c for cs in _platforms().values() for c in cs}
    assert named == set(COMPONENTS)
    for component in COMPONENTS:
        assert f"    {component}/" in DOC or f" {component}/ " in DOC, (
            f"{component} not in the tree"
        )
        assert f"### {component}" in DOC, component
        assert (DEPLOY / "overlays" / component / "kustomization.yaml").is_file(), component


def test_the_docs_kustomization_example_renders(tmp_path):
    block = re.search(r"```yaml\n(apiVersion: kustomize.config.k8s.io/v1beta1\n.*?)```", DOC, re.S)
    assert block, "no kustomization example"
    (tmp_path / "gpu-exporter").symlink_to(ROOT)
    site = tmp_path / "site"
    site.mkdir()
    (site / "kustomization.yaml").write_text(block.group(1))
    kubectl = require("kubectl", "kubectl (1.27 or newer, with kustomize)")
    p = subprocess.run([kubectl, "kustomize", str(site)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    objs = [o for o in yaml.safe_load_all(p.stdout) if o]
    image = _pod(objs)["containers"][0]["image"]
    assert image == f"registry.example.com/gpu-exporter:{__version__}"


def test_resources_as_stated(rendered):
    m = re.search(
        r"requests (\d+m) CPU and (\d+) MiB, limits (\d+m) CPU and (\d+) MiB; with the dra\s+"
        r"component, requests (\d+) MiB and limits (\d+) MiB",
        DOC,
    )
    assert m, "the Resources statement"
    base = _pod(rendered["base"])["containers"][0]["resources"]
    assert base == {
        "requests": {"cpu": m[1], "memory": f"{m[2]}Mi"},
        "limits": {"cpu": m[3], "memory": f"{m[4]}Mi"},
    }
    dra = _pod(rendered["dra"])["containers"][0]["resources"]
    assert (dra["requests"]["memory"], dra["limits"]["memory"]) == (f"{m[5]}Mi", f"{m[6]}Mi")


def test_tolerations_and_node_labels_as_stated(rendered):
    for t in _pod(rendered["all"])["tolerations"]:
        effect = f":{t['effect']}" if "effect" in t else ""
        value = f"={t['value']}" if "value" in t else ""
        assert f"`{t['key']}{value}{effect}`" in DOC or f"`{t['key']}` (any" in DOC, t
    terms = _pod(rendered["all"])["affinity"]["nodeAffinity"]
    terms = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for t in terms:
        (e,) = t["matchExpressions"]
        stated = e["key"] + (f"={e['values'][0]}" if e.get("values") else "")
        assert f"`{stated}" in DOC, stated
    ((key, value),) = _pod(rendered["gpu-operator"])["nodeSelector"].items()
    assert f'`nodeSelector: {{{key}: "{value}"}}`' in DOC


def test_rbac_scrape_and_namespace_as_stated(rendered):
    role = _one(rendered["dra"], "ClusterRole")
    verbs = {tuple(r["verbs"]) for r in role["rules"]}
    assert verbs == {("list", "watch")}
    assert "with `list` and `watch` on pods" in DOC and "no `get`" in DOC
    ep = _one(rendered["base"], "ServiceMonitor")["spec"]["endpoints"][0]
    assert ep["interval"] == "30s" and "scrapes every 30 s" in DOC
    assert ep["scrapeTimeout"] == "10s" and "with a 10 s timeout" in DOC
    assert not [o for o in rendered["base"] if o["kind"] == "Namespace"]
    assert _one(rendered["all"], "Namespace")["metadata"]["name"] == "gpu-exporter"
    labels = _one(rendered["all"], "Namespace")["metadata"]["labels"]
    for k in ("openshift.io/cluster-monitoring", "security.openshift.io/scc.podSecurityLabelSync"):
        assert f'`{k}: "{labels[k]}"`' in DOC, k


def test_scrape_job_as_stated():
    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yaml").read_text())
    assert job["job_name"] == "gpu-exporter" and job["honor_labels"] is True
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert "node" in targets and not targets & {"pod", "namespace"}
    assert "scrapes them as job\n`gpu-exporter` with `honor_labels: true`" in DOC
