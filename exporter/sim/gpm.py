"""GPM (GPU performance monitoring, Hopper and newer): samples and the metrics between two.

A sample records sim time and the device's cumulative activity; a metric is
the difference of two samples over their time difference, as in NVML. Each
MIG instance has its own activity (from its processes / load); PCIe and NVLink
traffic is the GPU's as a whole, on the GPU and on each of its instances alike
(DCGM serves those metrics per GPU only). SM occupancy over an interval with no
SM activity is NaN (occupancy per active cycle, of no cycle), as DCGM blanks it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
from collections.abc import Callable
from typing import Any

import pynvml

from exporter.sim import calls
from exporter.sim.calls import out, value
from exporter.sim.devices import Device, GpuState, MiB, MigState, new_handle
from exporter.sim.driverview import DriverView
from exporter.sim.gpmsamples import Sample

OK = pynvml.NVML_SUCCESS
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

# Share of the engine-busy time each pipe metric shows (plausible training mix); no two
# alike, so that a metric read under another's ID shows.
_RATIOS = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.92,
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: 0.08,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.55,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.02,
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 0.5,
    8: 0.01,  # NVML_GPM_METRIC_DMMA_TENSOR_UTIL (not named by pynvml before 13)
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.03,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.04,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.3,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.25,
}
_INFO = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: (b"GR_UTIL", b"Graphics engine active", b"%"),
    pynvml.NVML_GPM_METRIC_SM_UTIL: (b"SM_UTIL", b"SM active", b"%"),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: (b"SM_OCCUP", b"SM occupancy", b"%"),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (b"DRAM_BW", b"DRAM bandwidth used", b"%"),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: (b"PCIE_TX", b"PCIe transmit", b"MiB/sec"),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: (b"PCIE_RX", b"PCIe receive", b"MiB/sec"),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: (b"NVL_RX", b"NVLink receive", b"MiB/sec"),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (b"NVL_TX", b"NVLink transmit", b"MiB/sec"),
}
_PERCENT_INFO = (b"PIPE_UTIL", b"Pipe active", b"%")
_MEDIA_INFO = (b"MEDIA_UTIL", b"Media engine active", b"%")
_LINK_INFO = (b"NVL_LINK", b"NVLink bandwidth of one link", b"MiB/sec")
_FIRST_LINK_METRIC = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # L<n> RX = 62 + 2n, TX = 63 + 2n
_LINK_METRICS = 18


def _record(s: Sample, dev: Device, t: float) -> None:
    gpu = dev.gpu
    traffic = gpu.model.traffic
    util_s = dev.activity.util.integral(t)
    busy = gpu.activity.util.integral(t) / 100.0 * MiB
    s.device, s.t, s.util_s, s.mem_ratio = dev, t, util_s, dev.activity.mem_ratio
    s.pcie = (traffic["pcie_tx"] * busy, traffic["pcie_rx"] * busy)
    s.nvlink = (traffic["nvlink_tx"] * busy, traffic["nvlink_rx"] * busy)
    s.links = gpu.model.nvlinks
    s.dec, s.engines = dev.activity.dec, _engines(dev)


def _engines(dev: Device) -> tuple[int, int, int]:
    """(NVDEC, NVJPG, NVOFA) engines: a MIG instance's profile's, a GPU's largest profile's."""
    model = dev.gpu.model
    profile = dev.spec.profile if isinstance(dev, MigState) else None
    if profile is None and model.mig_profiles:
        profile = max(model.mig_profiles, key=lambda p: p.slices)
    if profile is None:
        return int(model.features.decoder), 0, 0
    return profile.dec, profile.jpeg, profile.ofa


# Per-engine metrics: NVDEC_<i> = 30 + i, NVJPG_<i> = 40 + i, NVOFA_<i> = 50 + i (nvml.h).
# Engine i of a kind is busy dec x share x (1 - i/8) percent: each engine its own value.
_ENGINE_METRICS = {30: (0, 1.0), 40: (1, 0.5), 50: (2, 0.25)}  # first id: (kind, share)


def _engine(metric_id: int, s: Sample) -> float | None:
    """An engine metric's percent over the interval, or None (not an engine metric, or no
    such engine on the device)."""
    first = metric_id - metric_id % 10
    kind = _ENGINE_METRICS.get(first)
    i = metric_id - first
    if kind is None or i >= s.engines[kind[0]] or i > 7:
        return None
    return s.dec * kind[1] * (1 - i / 8)


@calls.system("nvmlGpmSampleAlloc")
def sample_alloc(drv: DriverView, now: float, sample_ref: Any) -> int:
    buf, key = new_handle()
    drv.gpm.samples[key] = Sample(key, buf)
    ctypes.memmove(ctypes.addressof(out(sample_ref)), key, len(key))
    return OK


@calls.system("nvmlGpmSampleFree")
def sample_free(drv: DriverView, now: float, sample: Any) -> int:
    return OK if drv.gpm.samples.pop(_key(sample), None) is not None else INVALID_ARGUMENT


@calls.device("nvmlGpmQueryDeviceSupport", mig=True)
def query_support(drv: DriverView, dev: Device, now: float, support_ref: Any) -> int:
    support = out(support_ref)
    if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    support.isSupportedDevice = int(dev.gpu.model.features.gpm)
    return OK


@calls.device("nvmlGpmSampleGet", mig=True)
def sample_get(drv: DriverView, dev: Device, now: float, sample: Any) -> int:
    if not dev.gpu.model.features.gpm:
        return NOT_SUPPORTED
    s = drv.gpm.samples.get(_key(sample))
    if s is None:
        return INVALID_ARGUMENT
    _record(s, dev, now)
    return OK


@calls.device("nvmlGpmMigSampleGet")
def mig_sample_get(drv: DriverView, gpu: GpuState, now: float, gi: Any, sample: Any) -> int:
    if not gpu.model.features.gpm:
        return NOT_SUPPORTED
    if not gpu.mig_enabled:
        return INVALID_ARGUMENT
    mig = gpu.mig_by_gi(value(gi))
    if mig is None:
        return pynvml.NVML_ERROR_NOT_FOUND
    s = drv.gpm.samples.get(_key(sample))
    if s is None:
        return INVALID_ARGUMENT
    _record(s, mig, now)
    return OK


# The caller's c_nvmlGpmMetric_t entries are read and written as C code would, through
# the array's buffer: metricId, nvmlReturn, value, then the three metricInfo strings as
# pointers (to module-level bytes, alive for the process). pynvml's per-attribute
# structure wrappers made this the simulator's largest cost per cycle.
_HEAD = struct.Struct("@IId")
_ENTRY = struct.Struct("@IId3P")
assert _ENTRY.size == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_get = object.__getattribute__


@functools.cache
def _pointers(info: tuple[bytes, bytes, bytes]) -> tuple[int, int, int]:
    """Addresses of the info strings (the cache keeps them alive)."""
    a, b, c = (ctypes.cast(ctypes.c_char_p(s), ctypes.c_void_p).value or 0 for s in info)
    return a, b, c


@calls.system("nvmlGpmMetricsGet")
def metrics_get(drv: DriverView, now: float, metrics_ref: Any) -> int:
    mg = out(metrics_ref)
    if _get(mg, "version") != pynvml.NVML_GPM_METRICS_GET_VERSION:
        return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    metrics = _get(mg, "metrics")
    count = _get(mg, "numMetrics")
    if count > len(metrics):
        return INVALID_ARGUMENT
    s1 = drv.gpm.samples.get(_key(_get(mg, "sample1")))
    s2 = drv.gpm.samples.get(_key(_get(mg, "sample2")))
    if s1 is None or s2 is None or s1.device is None or s1.device is not s2.device:
        return INVALID_ARGUMENT
    dt = s2.t - s1.t
    if dt <= 0:
        # Two samples of the same instant (or in the wrong order) give no rates.
        return INVALID_ARGUMENT
    util = min(100.0, max(0.0, (s2.util_s - s1.util_s) / dt))
    buf = memoryview(metrics).cast("B")
    for i in range(count):
        at = i * _ENTRY.size
        (metric_id,) = struct.unpack_from("@I", buf, at)
        engine = _engine(metric_id, s1)
        if engine is not None:
            _ENTRY.pack_into(buf, at, metric_id, OK, engine, *_pointers(_MEDIA_INFO))
            continue
        compute = _metric(metric_id, s1.links)
        if compute is None:
            _HEAD.pack_into(buf, at, metric_id, NOT_SUPPORTED, 0.0)
            continue
        value_, info = compute(s1, s2, dt, util)
        _ENTRY.pack_into(buf, at, metric_id, OK, value_, *_pointers(info))
    return OK


Metric = Callable[[Sample, Sample, float, float], tuple[float, tuple[bytes, bytes, bytes]]]


@functools.cache
def _metric(metric_id: int, links: int) -> Metric | None:
    """How to compute a metric between two samples of a device with `links` NVLinks."""
    ratio = _RATIOS.get(metric_id)
    if metric_id == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY:
        info = _INFO[metric_id]
        return lambda a, b, dt, util: (util * 0.45 if util > 0 else math.nan, info)
    if ratio is not None:
        info = _INFO.get(metric_id, _PERCENT_INFO)
        return lambda a, b, dt, util: (util * ratio, info)
    if metric_id == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL:
        return lambda a, b, dt, util: (min(100.0, util * a.mem_ratio), _INFO[metric_id])
    rate = {
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: lambda x: x.pcie[0],
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: lambda x: x.pcie[1],
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: lambda x: x.nvlink[0],
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: lambda x: x.nvlink[1],
    }.get(metric_id)
    if rate is not None:
        if metric_id >= pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC and not links:
            return None
        return lambda a, b, dt, util: ((rate(b) - rate(a)) / dt / MiB, _INFO[metric_id])
    link, tx = divmod(metric_id - _FIRST_LINK_METRIC, 2)
    if metric_id >= _FIRST_LINK_METRIC and link < min(_LINK_METRICS, links):
        return lambda a, b, dt, util: (
            (b.nvlink[tx] - a.nvlink[tx]) / dt / MiB / links,
            _LINK_INFO,
        )
    return None


def _key(handle: Any) -> bytes:
    try:
        return bytes(handle)
    except TypeError:
        return b""
