"""alerts/prometheusrule.yaml: generated from the rule files, current, and valid for the CRD."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.alerts.conftest import RULE_FILES

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
SCHEMAS = REPO / "tests" / "fixtures" / "crds"  # vendored: README.md there
CRD = SCHEMAS / "monitoring.coreos.com_prometheusrules.yaml"


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return yaml.safe_load((ALERTS / "prometheusrule.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text(encoding="utf-8"))


def _schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise AssertionError(f"CRD has no version {version}")


def _closed(schema: Any) -> Any:
    """The schema with unknown fields forbidden wherever it lists the known ones.

    The API server silently prunes fields a structural schema does not know (a misspelt
    `for` would vanish); this turns such a field into a validation error instead.
    """
    if isinstance(schema, dict):
        schema = {key: _closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_closed(item) for item in schema]
    return schema


def _validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    # Not jsonschema.validate(): it checks the schema's own regexes with Python's engine,
    # which rejects the Go syntax of a pattern this file never uses (`^(?i)(abort|warn)?$`).
    return jsonschema.Draft7Validator(_closed(schema))


def test_manifest_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ALERTS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_manifest_holds_the_rule_files_unchanged(manifest: dict[str, Any]) -> None:
    sources = []
    for name in RULE_FILES:
        sources.extend(yaml.safe_load((ALERTS / name).read_text(encoding="utf-8"))["groups"])
    assert manifest["spec"]["groups"] == sources
    names = [group["name"] for group in sources]
    assert len(names) == len(set(names)), "group names must be unique across the files"


def test_manifest_validates_against_the_crd(manifest: dict[str, Any], crd: dict[str, Any]) -> None:
    group, _, version = manifest["apiVersion"].partition("/")
    assert group == crd["spec"]["group"]
    assert manifest["kind"] == crd["spec"]["names"]["kind"]
    name = manifest["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)
    _validator(_schema(crd, version)).validate(manifest)


@pytest.mark.parametrize(
    ("field", "value"),
    [("for", "10 minutes"), ("fro", "10m"), ("expr", ["not", "a", "string"])],
)
def test_the_crd_check_rejects_a_broken_rule(
    manifest: dict[str, Any], crd: dict[str, Any], field: str, value: Any
) -> None:
    broken = copy.deepcopy(manifest)
    broken["spec"]["groups"][-1]["rules"][0][field] = value
    with pytest.raises(jsonschema.ValidationError):
        _validator(_schema(crd, "v1")).validate(broken)
