"""alerts/migration/: each file publishes every renamed field under the other generation's
name, in that name's unit, with the driver-version label under both names; promtool
evaluates them on one series per field (values from exporter/catalog/dcgm-names.csv's factors)."""

from __future__ import annotations

import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from exporter.catalog.renames import renames

REPO = Path(__file__).resolve().parents[2]
MIGRATION = REPO / "alerts" / "migration"
LABELS = 'job="gpu-exporter", instance="10.0.1.5:9400", gpu="0", UUID="GPU-0"'
OLD_VALUE = Fraction(250)  # every field's value under its old name, in its old unit


def _case(to_new: bool) -> dict:
    series, expected = [], []
    label = next(r for r in renames() if r.is_label)
    for r in renames():
        if r.is_label:
            continue
        new = OLD_VALUE * r.factor
        src, dst = (r.old, r.new) if to_new else (r.new, r.old)
        have, want = (label.old, label.new) if to_new else (label.new, label.old)
        value, result = (OLD_VALUE, new) if to_new else (new, OLD_VALUE)
        series.append(
            {"series": f'{src}{{{LABELS}, {have}="580.95.05"}}', "values": f"{float(value)}x5"}
        )
        labels = f'{dst}{{{LABELS}, {have}="580.95.05", {want}="580.95.05"}}'
        expected.append(
            {
                "expr": dst,
                "eval_time": "2m",
                "exp_samples": [{"labels": labels, "value": float(result)}],
            }
        )
    name = "dcgm-4.9-names" if to_new else "dcgm-4.8-names"
    return {
        "rule_files": [str(MIGRATION / f"{name}.rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": expected}],
    }


@pytest.mark.parametrize("to_new", [True, False], ids=["dcgm-4.9-names", "dcgm-4.8-names"])
def test_migration_rules_publish_each_field_in_the_other_unit(
    to_new: bool, promtool: str, tmp_path: Path
) -> None:
    path = tmp_path / "renames.test.yaml"
    path.write_text(yaml.safe_dump(_case(to_new)), encoding="utf-8")
    got = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, got.stdout + got.stderr


def test_each_migration_file_covers_every_renamed_field() -> None:
    fields = [r for r in renames() if not r.is_label]
    for name, records in (("dcgm-4.9-names", "new"), ("dcgm-4.8-names", "old")):
        doc = yaml.safe_load((MIGRATION / f"{name}.rules.yaml").read_text(encoding="utf-8"))
        got = [rule["record"] for group in doc["groups"] for rule in group["rules"]]
        assert got == [getattr(r, records) for r in fields], name
