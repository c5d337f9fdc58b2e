"""The bundled rules under each --dcgm-exporter-version: every promtool test of alerts/tests
again, with its input series as that release of dcgm-exporter serves them.

4.8.2 is the tests as written (dcgm-exporter 4.8 names and units, the ``Hostname`` label);
4.8.4 serves ``hostname``; 4.9 serves ``hostname`` and the DCGM 4.7 name of each renamed
field, its values in the new unit (exporter/catalog/dcgm-names.csv: new = old x factor). The
expected alerts and recorded values are the same under every release, with the node label
under its release's name.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.catalog.renames import by_old
from tests.alerts.conftest import promtool_failures

REPO = Path(__file__).resolve().parents[2]
TESTS = sorted((REPO / "alerts" / "tests").glob("*.test.yaml"))
# release -> (the node label's name, whether fields have their DCGM 4.7 names)
RELEASES = {"4.8.2": ("Hostname", False), "4.8.4": ("hostname", False), "4.9": ("hostname", True)}
_STEP = re.compile(r"^(-?[\d.]+(?:e\d+)?)(?:([+-])([\d.]+(?:e\d+)?))?x(\d+)$")
_NAME = re.compile(r"^\s*(\w+)")


class _Loader(yaml.SafeLoader):
    """YAML as promtool reads it: ``00000000:18:00.0`` is a string, not YAML 1.1's base 60."""


_BASE60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_Loader.yaml_implicit_resolvers = {
    k: ([("tag:yaml.org,2002:str", _BASE60)] if k in "+-0123456789" else []) + list(v)
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _num(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else repr(float(x))


def scale_values(values: str, factor: Fraction) -> str:
    """promtool's expanding notation (``a``, ``axN``, ``a+bxN``, ``_``, ``stale``) times factor."""
    out = []
    for token in values.split():
        m = _STEP.match(token)
        if token in ("_", "stale") or token.startswith("_x"):
            out.append(token)
        elif m:
            start, sign, step, n = m.groups()
            more = f"{sign}{_num(Fraction(step) * factor)}" if sign else ""
            out.append(f"{_num(Fraction(start) * factor)}{more}x{n}")
        else:
            out.append(_num(Fraction(token) * factor))
    return " ".join(out)


def as_served(series: dict[str, Any], host: str, new_names: bool) -> dict[str, Any]:
    """One input series as a release serves it: node label, name and unit."""
    text = re.sub(r"\bHostname=", f"{host}=", series["series"])
    name = _NAME.match(text)
    r = by_old().get(name.group(1)) if name and new_names else None
    if r is None:
        return {**series, "series": text}
    text = text.replace(r.old, r.new, 1)
    return {**series, "series": text, "values": scale_values(str(series["values"]), r.factor)}


def _expected_labels(group: dict[str, Any], host: str) -> None:
    for case in group.get("alert_rule_test", []):
        for alert in case.get("exp_alerts") or []:
            labels = alert.get("exp_labels") or {}
            if "Hostname" in labels:
                labels[host] = labels.pop("Hostname")
    for case in group.get("promql_expr_test", []):
        for sample in case.get("exp_samples") or []:
            sample["labels"] = re.sub(r"\bHostname=", f"{host}=", sample["labels"])


def variant(path: Path, release: str) -> dict[str, Any]:
    """The promtool test file ``path`` with its inputs as ``release`` serves them."""
    host, new_names = RELEASES[release]
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    doc["rule_files"] = [str((path.parent / f).resolve()) for f in doc["rule_files"]]
    for group in doc["tests"]:
        group["input_series"] = [as_served(s, host, new_names) for s in group["input_series"]]
        _expected_labels(group, host)
    return doc


def test_scale_values_follows_promtools_notation() -> None:
    assert scale_values("0+12000x40 1 _ stale _x3 0.5x15", Fraction(1, 1000)) == (
        "0+12x40 0.001 _ stale _x3 0.0005x15"
    )
    assert scale_values("70000x20", Fraction(1048576)) == "73400320000x20"


def test_the_4_9_variant_has_no_renamed_field_under_its_old_name() -> None:
    text = yaml.safe_dump([variant(p, "4.9")["tests"] for p in TESTS])
    served = [n for n in by_old() if re.search(rf"'{n}\{{", text)]
    assert served == []
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS{" in text and "DCGM_FI_DEV_FB_USED_BYTES{" in text


@pytest.mark.parametrize("release", RELEASES)
def test_bundled_rules_fire_and_record_alike_under_each_release(
    release: str, promtool: str, tmp_path: Path
) -> None:
    files = []
    for path in TESTS:
        out = tmp_path / path.name
        out.write_text(yaml.safe_dump(variant(path, release), sort_keys=False), encoding="utf-8")
        files.append(out)
    failed = promtool_failures(promtool, files)
    assert failed == {}, "\n".join(failed.values())
