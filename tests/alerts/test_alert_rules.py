"""Alert and recording rules: promtool's checks and unit tests, and what every alert carries."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.alerts.conftest import RULE_FILES, promtool_failures

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks"
OVERVIEW = REPO / "docs" / "alerts.md"

SEVERITIES = {"critical", "warning", "info"}
CATEGORIES = {"hardware", "monitoring", "application", "efficiency"}
# Per-GPU alerts on gpu_exporter_gpu_up, whose series never carry pod labels (and whose
# labels are the exporter's own snake_case ones).
WITHOUT_POD_LABELS = {"GPUNotResponding", "GPUDisappeared"}
# About the whole job, not a node: fires when no target of it exists.
WITHOUT_NODE = {"GPUExporterTargetsAbsent"}
RUNBOOK_SECTIONS = (
    "## What it means",
    "## How to confirm",
    "## What to do",
    "## When to drain or replace",
)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def _alert_cases(files: list[Path]) -> list[dict[str, Any]]:
    cases = []
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            cases.extend(group.get("alert_rule_test", []))
    return cases


def _expr_cases(files: list[Path]) -> list[dict[str, Any]]:
    cases = []
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            cases.extend(group.get("promql_expr_test", []))
    return cases


def test_promtool_check_rules(promtool: str, alerts_dir: Path) -> None:
    result = _run([promtool, "check", "rules", *(str(alerts_dir / n) for n in RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(promtool: str, unit_test_files: list[Path]) -> None:
    assert unit_test_files
    failed = promtool_failures(promtool, unit_test_files)
    assert failed == {}, "\n".join(failed.values())


def test_every_alert_has_a_firing_and_a_quiet_case(
    alert_rules: list[dict[str, Any]], unit_test_files: list[Path]
) -> None:
    names = {rule["alert"] for rule in alert_rules}
    fired, quiet = set(), set()
    for case in _alert_cases(unit_test_files):
        (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    # promtool passes a quiet case for an alert name that does not exist: catch typos.
    assert (fired | quiet) - names == set()
    assert names - fired == set(), "alerts without a case where they fire"
    assert names - quiet == set(), "alerts without a case where they stay quiet"


def test_every_recording_rule_is_checked_by_value(
    recording_rules: list[dict[str, Any]], unit_test_files: list[Path]
) -> None:
    checked = " ".join(
        case["expr"] for case in _expr_cases(unit_test_files) if case.get("exp_samples")
    )
    untested = [
        rule["record"]
        for rule in recording_rules
        if not re.search(rf"(?<![\w:]){re.escape(rule['record'])}(?![\w:])", checked)
    ]
    assert untested == []


def test_alert_names_are_unique(alert_rules: list[dict[str, Any]]) -> None:
    names = [rule["alert"] for rule in alert_rules]
    assert len(names) == len(set(names))


def test_every_alert_has_severity_and_category(alert_rules: list[dict[str, Any]]) -> None:
    for rule in alert_rules:
        labels = rule.get("labels", {})
        assert set(labels) == {"severity", "category"}, rule["alert"]
        assert labels["severity"] in SEVERITIES, rule["alert"]
        assert labels["category"] in CATEGORIES, rule["alert"]


def test_summaries_are_plain_sentences(alert_rules: list[dict[str, Any]]) -> None:
    for rule in alert_rules:
        summary = rule["annotations"]["summary"]
        assert "{{" not in summary and "\n" not in summary, rule["alert"]
        assert summary[0].isupper() and summary.endswith("."), rule["alert"]


def test_descriptions_name_node_gpu_uuid_and_pod(alert_rules: list[dict[str, Any]]) -> None:
    """Per-GPU alerts name the GPU, its UUID, its host (either label spelling) and pod."""
    for rule in alert_rules:
        name, text = rule["alert"], rule["annotations"]["description"]
        if name not in WITHOUT_NODE:
            assert re.search(r"\$labels\.(node|Hostname|hostname)\b", text), name
        per_gpu = re.search(r"\bDCGM_|gpu_exporter_gpu_up|gpu_exporter_container_", rule["expr"])
        if not per_gpu:
            continue
        own = ("gpu", "uuid", "hostname")  # gpu_exporter_gpu_up's snake_case labels
        dcgm = ("gpu", "UUID", "Hostname", "hostname")
        for label in own if name in WITHOUT_POD_LABELS else dcgm:
            assert f"$labels.{label} " in text, f"{name}: description lacks {label}"
        if name not in WITHOUT_POD_LABELS:
            for label in ("namespace", "pod"):
                assert f"$labels.{label} " in text, f"{name}: description lacks {label}"


def test_rendered_descriptions_show_the_labels_they_know(unit_test_files: list[Path]) -> None:
    """In every firing case of the unit tests, the description shows the GPU's identity."""
    for case in _alert_cases(unit_test_files):
        for alert in case.get("exp_alerts") or []:
            labels, text = alert["exp_labels"], alert["exp_annotations"]["description"]
            host = labels.get("Hostname") or labels.get("hostname") or labels.get("node")
            assert case["alertname"] in WITHOUT_NODE or (host and host in text), case["alertname"]
            if "gpu" in labels:
                assert f"GPU {labels['gpu']} " in text, case["alertname"]
            for key in ("UUID", "namespace", "pod", "GPU_I_ID"):
                if key in labels:
                    assert labels[key] in text, f"{case['alertname']}: {key}"


def test_runbook_urls_point_at_shipped_runbooks(alert_rules: list[dict[str, Any]]) -> None:
    bases = set()
    for rule in alert_rules:
        url = rule["annotations"]["runbook_url"]
        base, _, filename = url.rpartition("/")
        bases.add(base)
        assert filename == f"{rule['alert']}.md", url
        assert (RUNBOOKS / filename).is_file(), f"missing docs/runbooks/{filename}"
    assert len(bases) == 1 and next(iter(bases)).endswith("/docs/runbooks"), bases


def test_runbooks_explain_confirm_act_and_replace(alert_rules: list[dict[str, Any]]) -> None:
    for rule in alert_rules:
        text = (RUNBOOKS / f"{rule['alert']}.md").read_text(encoding="utf-8")
        assert text.startswith(f"# {rule['alert']}\n"), rule["alert"]
        labels = rule["labels"]
        stated = f"Severity: {labels['severity']}. Category: {labels['category']}."
        assert stated in text, f"{rule['alert']}: runbook does not say {stated!r}"
        positions = [text.find(section) for section in RUNBOOK_SECTIONS]
        assert -1 not in positions and positions == sorted(positions), rule["alert"]
        confirm = text[positions[1] : positions[2]]
        assert "nvidia-smi" in confirm, f"{rule['alert']}: no nvidia-smi check"


def test_every_runbook_belongs_to_an_alert(alert_rules: list[dict[str, Any]]) -> None:
    names = {rule["alert"] for rule in alert_rules}
    assert {path.stem for path in RUNBOOKS.glob("*.md")} == names


def _xid_codes(expr: str) -> set[int]:
    patterns = set(re.findall(r'xid=~"([^"]+)"', expr))
    assert len(patterns) == 1, expr
    pattern = patterns.pop()
    return {code for code in range(1000) if re.fullmatch(pattern, str(code))}


def test_xid_classes(alert_rules: list[dict[str, Any]]) -> None:
    """XIDs alert from the counter, by class, each code in exactly one class."""
    classes = {
        rule["alert"]: (rule["labels"], _xid_codes(rule["expr"]))
        for rule in alert_rules
        if "DCGM_EXP_XID_ERRORS_TOTAL" in rule["expr"]
    }
    for rule in alert_rules:
        assert "DCGM_FI_DEV_XID_ERRORS" not in rule["expr"], "the last-XID gauge is sticky"
    hardware = {48, 64, 74, 79, 92, 94, 95, 119, 120, 140, *range(144, 151)}
    application = {13, 31, 43, 45}
    seen: list[int] = []
    for name, (labels, codes) in classes.items():
        seen.extend(codes)
        if labels["category"] == "application":
            assert codes == application and labels["severity"] == "warning", name
        else:
            assert labels["category"] == "hardware", name
            assert labels["severity"] in {"critical", "warning"}, name
            hardware -= codes
    assert hardware == set(), "hardware XIDs without an alert"
    assert len(seen) == len(set(seen)), "an XID code in two classes"


def test_overview_lists_every_alert_with_its_labels(alert_rules: list[dict[str, Any]]) -> None:
    rows = {
        match.group(1): (match.group(2), match.group(3))
        for match in re.finditer(
            r"^\| \[(\w+)\]\(runbooks/\1\.md\) \| (\w+) \| (\w+) \|",
            OVERVIEW.read_text(encoding="utf-8"),
            re.M,
        )
    }
    expected = {
        rule["alert"]: (rule["labels"]["severity"], rule["labels"]["category"])
        for rule in alert_rules
    }
    assert rows == expected
