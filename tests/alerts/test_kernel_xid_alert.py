"""An XID 79 written to the (simulated) kernel log raises the exporter's XID counter and
the critical alert, while the NVML event path carries nothing: the exporter's own
exposition is the input of a promtool unit test of alerts/gpu-alerts.rules.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from exporter.sim import Fault
from tests.support.exposition import Stages, find
from tests.support.simnode import CATALOG, node, until

ALERT = "GPUXidHardwareCritical"


def _rule(alerts_dir: Path) -> dict:
    groups = yaml.safe_load((alerts_dir / "gpu-alerts.rules.yaml").read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == ALERT]
    return rule


def test_xid_79_from_the_kernel_log_fires_the_critical_alert(tmp_path, promtool, alerts_dir):
    log = tmp_path / "kmsg"
    with node(kernel_log=str(log), catalog=CATALOG) as n:
        n.cycle()
        [evset] = n.driver.events.sets.values()
        n.driver.inject(Fault("xid", gpu=1, xid=79))
        until("the kernel log's XID", lambda: n.col.xid.state().counts != ())
        snap = n.cycle()
        assert not evset.queue  # the NVML event path was silent
        builder = Stages()
        builder.publish(snap, CATALOG)
        text = builder.text
    (series,) = find(text, "DCGM_EXP_XID_ERRORS_TOTAL")
    assert (series.labels["gpu"], series.labels["xid"], series.value) == ("1", "79", 1)
    scraped = {"job": "gpu-exporter", "instance": "10.0.0.1:9400", **series.labels}  # +target
    labels = ", ".join(f'{k}="{v}"' for k, v in scraped.items())
    rule = _rule(alerts_dir)
    expected = {**rule["labels"], **scraped}
    description = (
        f"GPU 1 ({series.labels['UUID']}, {series.labels['modelName']}) on node node-a "
        "reported XID 79 (GPU has fallen off the bus) in the last 10 minutes."
    )
    annotations = {
        "summary": rule["annotations"]["summary"],
        "description": description,
        "runbook_url": rule["annotations"]["runbook_url"],
    }
    test = {
        "rule_files": [str(alerts_dir / "gpu-alerts.rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                # absent until the XID, then the exporter's value on every scrape
                "input_series": [
                    {"series": f"DCGM_EXP_XID_ERRORS_TOTAL{{{labels}}}", "values": "_x4 1x20"}
                ],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": ALERT, "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": ALERT,
                        "exp_alerts": [{"exp_labels": expected, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "kernel-xid.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    p = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
