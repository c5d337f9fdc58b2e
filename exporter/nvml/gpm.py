"""GPM profiling metrics (DCGM_FI_PROF_*) for Hopper and newer, per GPU and per MIG instance.

GPM needs two samples at least 100 ms apart. Each device keeps the sample of
the previous cycle, so every cycle costs one sample and one metrics call per
device, and the first values appear one interval after a device is first seen.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import Field, Source
from exporter.nvml.session import Session, Unavailable

log = logging.getLogger(__name__)

MIN_GAP_S = 0.1  # NVML needs samples at least this far apart


class _State:
    __slots__ = ("prev", "spare", "taken")

    def __init__(self) -> None:
        self.prev = N.nvmlGpmSampleAlloc()
        self.spare = N.nvmlGpmSampleAlloc()
        self.taken = 0.0

    def free(self) -> None:
        for s in (self.prev, self.spare):
            with contextlib.suppress(N.NVMLError):
                N.nvmlGpmSampleFree(s)


class GpmReader:
    """Samples GPM each cycle and returns the enabled DCGM_FI_PROF_* ratios and rates."""

    def __init__(self, session: Session, fields: Iterable[Field]) -> None:
        self.session = session
        self.fields = [f for f in fields if f.source is Source.GPM]
        self._support: dict[str, bool] = {}  # physical GPU UUID -> GPM supported
        self._state: dict[str, _State] = {}
        self._req: N.c_nvmlGpmMetricsGet_t | None = None

    def supported(self, gpu: Device) -> bool:
        """Whether the physical GPU supports GPM (asked once per GPU)."""
        ok = self._support.get(gpu.uuid)
        if ok is None:
            try:
                ok = bool(N.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice)
            except N.NVMLError as e:
                err = self.session.failure("nvmlGpmQueryDeviceSupport", e)
                if not isinstance(err, Unavailable):
                    raise err from None
                ok = False
            if not ok and self.fields:
                log.info(
                    "GPU %d (%s, %s): DCGM_FI_PROF_* fields need GPM (Hopper or newer); omitted",
                    gpu.index,
                    gpu.uuid,
                    gpu.model,
                )
            self._support[gpu.uuid] = ok
        return ok

    def forget(self, keys: Iterable[str]) -> None:
        """Free samples of devices that went away."""
        for key in keys:
            st = self._state.pop(key, None)
            if st is not None:
                st.free()
            self._support.pop(key, None)

    def close(self) -> None:
        self.forget(list(self._state))

    def read(self, dev: Device, now: float) -> dict[str, float]:
        """Sample ``dev`` and return metrics against its previous sample ({} on the first)."""
        if not self.fields or not self.supported(dev.parent or dev):
            return {}
        st = self._state.get(dev.key)
        fresh = st is None
        try:
            if st is None:
                st = self._state[dev.key] = _State()
            elif now - st.taken < MIN_GAP_S:
                return {}
            if dev.parent is not None:
                N.nvmlGpmMigSampleGet(dev.parent.handle, dev.gi, st.spare)
            else:
                N.nvmlGpmSampleGet(dev.handle, st.spare)
        except N.NVMLError as e:
            return self._failed("nvmlGpmSampleGet", e)
        st.prev, st.spare = st.spare, st.prev
        st.taken = now
        if fresh:
            return {}
        return self._metrics(st)

    def _failed(self, function: str, e: N.NVMLError) -> dict[str, float]:
        """No GPM values this cycle for a call that failed (counted). A MIG instance
        removed mid-cycle answers NOT_FOUND or INVALID_ARGUMENT: that must not fail the
        other devices' cycle. A lost GPU or a driver gone still propagates."""
        err = self.session.failure(function, e)
        if isinstance(err, Unavailable | RuntimeError):
            return {}
        raise err from None

    def _request(self) -> N.c_nvmlGpmMetricsGet_t:
        """One request struct, reused: it holds room for every GPM metric (~19 KiB), and
        building it each call was the largest cost of a cycle in the benchmarks."""
        if self._req is None:
            req = N.c_nvmlGpmMetricsGet_t()
            req.version = N.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(self.fields)
            for i, f in enumerate(self.fields):
                req.metrics[i].metricId = f.gpm_metric
            self._req = req
        return self._req

    def _metrics(self, st: _State) -> dict[str, float]:
        req = self._request()
        req.sample1 = st.spare  # older sample
        req.sample2 = st.prev
        try:
            N.nvmlGpmMetricsGet(req)
        except N.NVMLError as e:
            return self._failed("nvmlGpmMetricsGet", e)
        out = {}
        for i, f in enumerate(self.fields):
            m = req.metrics[i]
            if m.nvmlReturn == N.NVML_SUCCESS:
                out[f.name] = f.convert(m.value)
        return out
