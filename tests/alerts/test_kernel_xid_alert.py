"""An XID 79 written to the (simulated) kernel log raises the exporter's XID counter and
the critical alert, while the NVML event path carries nothing: the exporter's own
exposition is the input of a promtool unit test of alerts/gpu-alerts.rules.yaml."""

from __future__ import annotations

from exporter.sim import Fault
from tests.support.exposition import Stages, find
from tests.support.promtest import TARGET, assert_fires
from tests.support.simnode import CATALOG, node, until

ALERT = "GPUXidHardwareCritical"


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
    scraped = {**TARGET, **series.labels}
    description = (
        f"GPU 1 ({series.labels['UUID']}, {series.labels['modelName']}) on node node-a "
        "reported XID 79 (GPU has fallen off the bus) in the last 10 minutes."
    )
    # absent until the XID, then the exporter's value on every scrape
    series_in = ("DCGM_EXP_XID_ERRORS_TOTAL", scraped, "_x4 1x20")
    assert_fires(
        promtool, tmp_path, alerts_dir, ALERT, series_in, ("3m", "6m"), scraped, description
    )
