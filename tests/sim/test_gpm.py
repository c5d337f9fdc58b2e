"""GPM on Hopper (whole GPU and per MIG instance) and its absence elsewhere."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.handles import handle, mig_handles

M = pynvml
PERCENT = [
    M.NVML_GPM_METRIC_GRAPHICS_UTIL,
    M.NVML_GPM_METRIC_SM_UTIL,
    M.NVML_GPM_METRIC_SM_OCCUPANCY,
    M.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    M.NVML_GPM_METRIC_DRAM_BW_UTIL,
    M.NVML_GPM_METRIC_FP64_UTIL,
    M.NVML_GPM_METRIC_FP32_UTIL,
    M.NVML_GPM_METRIC_FP16_UTIL,
]
RATES = [
    M.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    M.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    M.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    M.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
]


def metrics(s1, s2, ids):
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, metric in enumerate(ids):
        mg.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(mg)
    return {mg.metrics[i].metricId: mg.metrics[i] for i in range(len(ids))}


def two_samples(clock, take, seconds=1.0):
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    take(s1)
    clock.advance(seconds)
    take(s2)
    return s1, s2


def test_whole_gpu_metrics(default, clock):
    h = handle(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = two_samples(clock, lambda s: pynvml.nvmlGpmSampleGet(h, s))
    got = metrics(s1, s2, [*PERCENT, *RATES, 9999])
    for metric in PERCENT:
        assert got[metric].nvmlReturn == pynvml.NVML_SUCCESS
        assert 0 <= got[metric].value <= 100
    assert got[M.NVML_GPM_METRIC_GRAPHICS_UTIL].value > 50  # GPU 0 runs at ~85 %
    for metric in RATES:
        assert got[metric].value > 0  # MiB/s
    assert got[9999].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    pynvml.nvmlGpmSampleFree(s1)
    pynvml.nvmlGpmSampleFree(s2)


def test_media_engine_metrics_answer_for_the_engines_the_gpu_has(default, clock):
    """NVML-REVIEW N13: NVDEC/NVJPG/NVOFA GPM metrics (nvml.h 30-37, 40-47, 50) exist on a
    Hopper GPU (7 NVDEC, 7 NVJPG, 1 OFA on H100, its 7g MIG profile); ids past its
    engines are NOT_SUPPORTED."""
    h = handle(0)
    s1, s2 = two_samples(clock, lambda s: pynvml.nvmlGpmSampleGet(h, s))
    got = metrics(s1, s2, [30, 36, 37, 40, 46, 47, 50])
    ok = {m for m, e in got.items() if e.nvmlReturn == pynvml.NVML_SUCCESS}
    assert ok == {30, 36, 40, 46, 50}
    assert all(0 <= got[m].value <= 100 for m in ok)


def test_idle_gpu_reads_zero(default, clock):
    h = handle(3)
    s1, s2 = two_samples(clock, lambda s: pynvml.nvmlGpmSampleGet(h, s))
    assert metrics(s1, s2, [M.NVML_GPM_METRIC_SM_UTIL])[M.NVML_GPM_METRIC_SM_UTIL].value == 0


def test_mig_instances_have_their_own_activity(default, clock):
    parent = handle(6)
    values = {}
    for m in mig_handles(parent):
        gi = pynvml.nvmlDeviceGetGpuInstanceId(m)
        s1, s2 = two_samples(clock, lambda s, gi=gi: pynvml.nvmlGpmMigSampleGet(parent, gi, s))
        values[gi] = metrics(s1, s2, [M.NVML_GPM_METRIC_SM_UTIL])[M.NVML_GPM_METRIC_SM_UTIL].value
        # a MIG handle samples the same instance
        s3, s4 = two_samples(clock, lambda s, m=m: pynvml.nvmlGpmSampleGet(m, s))
        assert metrics(s3, s4, [M.NVML_GPM_METRIC_SM_UTIL])[M.NVML_GPM_METRIC_SM_UTIL].value >= 0
    idle = [gi for gi, v in values.items() if v == 0]
    busy = [gi for gi, v in values.items() if v > 10]
    assert len(idle) == 2 and len(busy) == 5  # two of the seven instances run nothing
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(parent, 3, pynvml.nvmlGpmSampleAlloc())


def test_same_instant_samples_are_refused(default):
    h = handle(0)
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, s1)
    pynvml.nvmlGpmSampleGet(h, s2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metrics(s1, s2, [M.NVML_GPM_METRIC_SM_UTIL])


@pytest.mark.parametrize("index", [1, 2, 3])
def test_not_supported_before_hopper(mixed, index):
    h = handle(index)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())
