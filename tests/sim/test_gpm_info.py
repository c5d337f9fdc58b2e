"""GPM metric entries carry their description strings, as NVML fills them."""

from __future__ import annotations

import pynvml

from tests.sim.handles import handle
from tests.sim.test_gpm import metrics, two_samples


def test_metric_info_names_each_metric(default, clock):
    h = handle(0)
    s1, s2 = two_samples(clock, lambda s: pynvml.nvmlGpmSampleGet(h, s))
    ids = [pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, 9999]
    got = metrics(s1, s2, ids)
    sm, pcie = got[ids[0]], got[ids[1]]
    assert (sm.metricInfo.shortName, sm.metricInfo.longName) == (b"SM_UTIL", b"SM active")
    assert (sm.metricInfo.unit, pcie.metricInfo.unit) == (b"%", b"MiB/sec")
    assert got[9999].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert got[9999].value == 0.0
    for s in (s1, s2):
        pynvml.nvmlGpmSampleFree(s)
