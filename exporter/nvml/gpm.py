"""GPM profiling metrics (DCGM_FI_PROF_*) for Hopper and newer, per GPU and per MIG instance.

GPM needs two samples at least 100 ms apart. Each device keeps the sample of
the previous cycle, so every cycle costs one sample and one metrics call per
device. A device seen for the first time (at start, or a MIG instance of a new
layout) is primed (see exporter/nvml/prime.py): :meth:`GpmReader.prime` takes
its first sample, the cycle waits MIN_GAP_S once for all such devices, and its
values are in that same cycle.

Which metrics a sample serves follows DCGM's field levels: a whole GPU all of them;
a MIG instance its own (the INSTANCE-scope fields); a MIG-enabled GPU, sampled as a
GPU, the GPU-level ones (PCIe and NVLink traffic, DEVICE scope). A metric NVML
answers NaN for is left out, as DCGM blanks it.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import time
from collections.abc import Callable, Iterable, Sequence

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.fields import Field, Scope, Source
from exporter.nvml.session import CallFailed, NvmlProblem, Session, Unavailable

log = logging.getLogger(__name__)

MIN_GAP_S = 0.1  # NVML needs samples at least this far apart
_METRICS = N.c_nvmlGpmMetricsGet_t.metrics.offset
_RET, _VALUE = N.c_nvmlGpmMetric_t.nvmlReturn, N.c_nvmlGpmMetric_t.value
_TOO_CLOSE = frozenset({N.NVML_ERROR_INVALID_ARGUMENT})  # samples too close together


class _State:
    __slots__ = ("prev", "primed", "session", "spare", "taken")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.prev = session.run("nvmlGpmSampleAlloc")
        try:
            self.spare = session.run("nvmlGpmSampleAlloc")
        except NvmlProblem:
            session.release("nvmlGpmSampleFree", self.prev)
            raise
        self.taken = 0.0
        self.primed = False  # prev holds a sample taken MIN_GAP_S before this cycle's

    def free(self) -> None:
        for s in (self.prev, self.spare):
            self.session.release("nvmlGpmSampleFree", s)


class GpmReader:
    """Samples GPM each cycle and returns the enabled DCGM_FI_PROF_* ratios and rates."""

    def __init__(self, session: Session, fields: Iterable[Field]) -> None:
        self.session = session
        self.fields: list[Field] = []
        self._support: dict[str, bool] = {}  # physical GPU UUID -> GPM supported
        self._state: dict[str, _State] = {}
        self._requests: dict[int, _Request] = {}  # id of a selection -> its request
        self.sleep: Callable[[float], None] = time.sleep  # waits between priming samples
        self.set_fields(fields)

    def set_fields(self, fields: Iterable[Field]) -> None:
        """Read these fields' GPM metrics from the next read on (a metrics-file reload)."""
        self.fields = [f for f in fields if f.source is Source.GPM]
        self._gpu_level = tuple(f for f in self.fields if f.scope is Scope.DEVICE)
        self._own = tuple(f for f in self.fields if f.scope is Scope.INSTANCE)
        self._all = tuple(self.fields)
        self._requests.clear()

    def selection(self, dev: Device, mig_gpu: bool = False) -> tuple[Field, ...]:
        """The metrics a sample of ``dev`` serves: a MIG instance its own, a MIG-enabled
        GPU (``mig_gpu``) the GPU-level ones, a whole GPU all."""
        if mig_gpu:
            return self._gpu_level
        return self._own if dev.parent is not None else self._all

    def supported(self, gpu: Device) -> bool:
        """Whether the physical GPU supports GPM (asked once per GPU)."""
        ok = self._support.get(gpu.uuid)
        if ok is None:
            try:
                support = self.session.run("nvmlGpmQueryDeviceSupport", gpu.handle)
                ok = bool(support.isSupportedDevice)
            except Unavailable:
                ok = False
            if not ok:
                where = f"GPU {gpu.index} ({gpu.uuid}, {gpu.model})"
                for f in self.fields:
                    self.session.unsupported_field(f.name, where, "needs GPM (Hopper or newer)")
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

    def prime(self, devs: Sequence[Device], now: float, mig_gpus: Sequence[Device] = ()) -> bool:
        """Take a first sample of every device not sampled yet (of ``devs``, whole GPUs
        and MIG instances, and ``mig_gpus``, MIG-enabled GPUs); True if any was taken.

        The caller then waits MIN_GAP_S (``self.sleep``) once for all devices, and
        the next :meth:`read` of those devices returns values in the same cycle.
        Errors are left to :meth:`read`, which meets them again.
        """
        taken = False
        wanted = [(d, False) for d in devs] + [(g, True) for g in mig_gpus]
        for dev, mig_gpu in wanted:
            if not self.selection(dev, mig_gpu) or dev.key in self._state:
                continue
            if not self._supported_quietly(dev):
                continue
            try:
                st = self._state[dev.key] = _State(self.session)
                self._sample(dev, st.prev)
            except NvmlProblem:  # counted by the session
                self.forget([dev.key])
                continue
            st.taken, st.primed = now, True
            taken = True
        return taken

    def _supported_quietly(self, dev: Device) -> bool:
        try:
            return self.supported(dev.parent or dev)
        except NvmlProblem:  # read() meets it again and reports it
            return False

    def _sample(self, dev: Device, sample: object) -> None:
        # The arguments pynvml's nvmlGpmMigSampleGet / nvmlGpmSampleGet pass, without the wrapper.
        if dev.parent is not None:
            self.session.c_call("nvmlGpmMigSampleGet", dev.parent.handle, dev.gi, sample)
        else:
            self.session.c_call("nvmlGpmSampleGet", dev.handle, sample)

    def read(self, dev: Device, now: float, mig_gpu: bool = False) -> dict[str, float]:
        """Sample ``dev`` and return metrics against its previous sample ({} on the first);
        ``mig_gpu``: ``dev`` is a MIG-enabled GPU, read for its GPU-level metrics."""
        fields = self.selection(dev, mig_gpu)
        if not fields or not self.supported(dev.parent or dev):
            return {}
        st = self._state.get(dev.key)
        fresh = st is None
        primed = st is not None and st.primed
        try:
            if st is None:
                st = self._state[dev.key] = _State(self.session)
            elif primed:
                st.primed = False
            elif now - st.taken < MIN_GAP_S:
                return {}
            self._sample(dev, st.spare)
        except NvmlProblem as e:
            return self._failed(e)
        st.prev, st.spare = st.spare, st.prev
        st.taken = now
        if fresh:
            return {}
        return self._metrics(st, self._request(fields), quiet=primed)

    @staticmethod
    def _failed(err: NvmlProblem) -> dict[str, float]:
        """No GPM values this cycle for a call that failed (counted). A MIG instance
        removed mid-cycle answers NOT_FOUND or INVALID_ARGUMENT: that must not fail the
        other devices' cycle. A lost GPU or a driver gone still propagates."""
        if isinstance(err, Unavailable | CallFailed):
            return {}
        raise err

    def _request(self, fields: tuple[Field, ...]) -> _Request:
        """The request for these metrics, built once and reused: it holds room for every
        GPM metric (~19 KiB), and building it each call was the largest cost of a cycle
        in the benchmarks."""
        req = self._requests.get(id(fields))
        if req is None:
            req = self._requests[id(fields)] = _Request(fields)
        return req

    def _metrics(self, st: _State, req: _Request, quiet: bool = False) -> dict[str, float]:
        """Metrics between the two samples. ``quiet``: the pair came from priming; if
        the driver finds it too close (a clock that did not move during the wait), the
        values come next cycle and nothing is counted."""
        put = ctypes.Structure.__setattr__  # past pynvml's wrapper, which only encodes str
        put(req.get, "sample1", st.spare)  # older sample
        put(req.get, "sample2", st.prev)
        try:
            got = self.session.c_call(
                "nvmlGpmMetricsGet", ctypes.byref(req.get), empty=_TOO_CLOSE if quiet else ()
            )
        except NvmlProblem as e:
            return self._failed(e)
        if not got:
            return {}
        out = {}
        raw = req.unpack.unpack_from(req.get, _METRICS)
        ok = N.NVML_SUCCESS
        for (name, scale, f), ret, value in zip(req.entries, raw[::2], raw[1::2], strict=True):
            if ret == ok and value == value:  # NaN != NaN: DCGM blanks a NaN metric
                # f.convert for the ratios and rates GPM gives (float, scaled), inline
                out[name] = value * scale if not f.integer and scale != 1.0 else f.convert(value)
        return out


class _Request:
    """One nvmlGpmMetricsGet request for a set of metrics, and how to unpack its answer."""

    __slots__ = ("entries", "get", "unpack")

    def __init__(self, fields: tuple[Field, ...]) -> None:
        get = N.c_nvmlGpmMetricsGet_t()
        get.version = N.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(fields)
        for i, f in enumerate(fields):
            get.metrics[i].metricId = f.gpm_metric
        self.get = get
        self.entries = [(f.name, f.scale, f) for f in fields]  # (name, scale, field) per metric
        # Each metric's (nvmlReturn, value), unpacked from the request's buffer in one go.
        size = ctypes.sizeof(N.c_nvmlGpmMetric_t)
        gap = _VALUE.offset - _RET.offset - 4
        one = f"{_RET.offset}xI{gap}xd{size - _VALUE.offset - 8}x"
        self.unpack = struct.Struct("<" + one * len(fields))
