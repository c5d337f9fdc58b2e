"""Rendered manifests (kubectl kustomize) for the base, each overlay and all components at once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import ROOT, require

DEPLOY = ROOT / "deploy"
COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir() if p.is_dir())
# Components left out of "all": without-prometheus-operator excludes kube-prometheus-stack.
EXCLUSIVE = {"without-prometheus-operator"}
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
# "moved": the existing-namespace overlay with every other combinable component, as
# docs/deploy.md tells users to copy and extend it.
TARGETS = ["base", *OVERLAYS, "all", "moved"]
MOVED_NAMESPACE = "monitoring"
SCHEMAS = ROOT / "tests" / "fixtures" / "crds"  # vendored: README.md there


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "image: builds and runs the container image with buildah (minutes on the first run)",
    )


def render(folder: Path) -> list[dict[str, Any]]:
    kubectl = require("kubectl", "kubectl (1.27 or newer, with kustomize)")
    p = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, f"kubectl kustomize {folder}:\n{p.stderr}"
    return [d for d in yaml.safe_load_all(p.stdout) if d]


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """Target name -> its objects. "all" is deploy/namespace and the base with every component
    that combines with the others, as a user would put them together in a kustomization of
    their own (the README's install)."""
    combo = tmp_path_factory.mktemp("all-components")
    rel = os.path.relpath(DEPLOY, combo)
    (combo / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{rel}/namespace", f"{rel}/base"],
                "components": [f"{rel}/components/{c}" for c in COMPONENTS if c not in EXCLUSIVE],
            }
        )
    )
    moved = tmp_path_factory.mktemp("moved") / "site"
    moved.mkdir()
    overlay = yaml.safe_load(
        (DEPLOY / "overlays" / "existing-namespace" / "kustomization.yaml").read_text()
    )
    rel = os.path.relpath(DEPLOY, moved)
    overlay["resources"] = [f"{rel}/base"]
    overlay["components"] = [f"{rel}/components/{c}" for c in COMPONENTS if c not in EXCLUSIVE]
    (moved / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    folders = {"base": DEPLOY / "base", "all": combo, "moved": moved}
    folders |= {t: DEPLOY / "overlays" / t for t in TARGETS if t not in folders}
    return {name: render(folder) for name, folder in folders.items()}


@pytest.fixture(scope="session")
def crds() -> dict[str, dict[str, Any]]:
    """Kind -> the openAPIV3Schema of its v1 CRD, from the vendored copies."""
    out = {}
    for path in SCHEMAS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["name"] == "v1":
                out[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return out
