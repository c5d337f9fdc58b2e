"""The one choke point for NVML calls: init, shutdown, and errors turned into outcomes.

Every pynvml call goes through :meth:`Session.call` (a field's :class:`Call`),
:meth:`Session.run` (any other function) or :meth:`Session.c_call` (the C
function with prepared arguments, for the hottest calls), which count failures by function and
code (``gpu_exporter_nvml_errors_total``) and map NVML's error codes to the
things a caller acts on, all :class:`NvmlProblem`: the value is absent on this
device (:class:`Unavailable`, also when the driver or pynvml lacks the function),
the device is gone (:class:`DeviceLost`), NVML itself is unusable
(:class:`DriverGone`: the process must restart, since pynvml never loads the library
again), or this call failed this time (:class:`CallFailed`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Collection
from typing import Any

import pynvml as N

from exporter.nvml.fields import Call
from exporter.runtime.cpushare import offer

log = logging.getLogger(__name__)

_UNAVAILABLE = {N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_FUNCTION_NOT_FOUND}
_LOST = {N.NVML_ERROR_GPU_IS_LOST, N.NVML_ERROR_RESET_REQUIRED}
_DRIVER = {
    N.NVML_ERROR_UNINITIALIZED,
    N.NVML_ERROR_DRIVER_NOT_LOADED,
    N.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    N.NVML_ERROR_LIBRARY_NOT_FOUND,
}


_NAMED = 40  # fields the startup summary names; the rest are counted


class NvmlProblem(Exception):
    """An NVML call failed: ``function`` is the NVML function, ``code`` NVML's error code."""

    def __init__(self, message: str, function: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.function = function
        self.code = code


class Unavailable(NvmlProblem):
    """NVML cannot give this value on this device (NotSupported, or the driver lacks the call)."""


class DeviceLost(NvmlProblem):
    """The GPU stopped answering (GPU_IS_LOST, reset required)."""


class DriverGone(NvmlProblem):
    """NVML itself is unusable (no driver, a library of another version than the kernel
    module, NVML shut down): only a new process, with the library then installed, can
    use it again."""


# nvmlInit's codes on a host without NVIDIA's driver (its library, or its kernel module)
NO_DRIVER = frozenset({N.NVML_ERROR_LIBRARY_NOT_FOUND, N.NVML_ERROR_DRIVER_NOT_LOADED})


class CallFailed(NvmlProblem):
    """Any other error (INVALID_ARGUMENT, UNKNOWN, ...): this call failed; try next cycle."""


_CODE_NAMES = {
    getattr(N, n): n[len("NVML_ERROR_") :]
    for n in dir(N)
    if n.startswith("NVML_ERROR_") and isinstance(getattr(N, n), int)
}


def code_name(code: int) -> str:
    """NVML's symbolic name for an error code, e.g. ``NOT_SUPPORTED``."""
    return _CODE_NAMES.get(code, str(code))


class Session:
    """An initialised NVML library; thread safe (NVML is, and the counters are locked)."""

    def __init__(self) -> None:
        self.errors: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self.driver_version = ""
        self.nvml_version = ""
        self.up = False
        self.unsupported: dict[str, str] = {}  # field name -> where and why, first seen
        self._summarized = False

    def open(self) -> None:
        """Initialise NVML; raises :class:`DriverGone` with NVML's reason if it cannot.

        NVML_INIT_FLAG_NO_GPUS: a node with no visible GPU initialises (with 0 GPUs)
        rather than failing with GPU_NOT_FOUND.
        """
        try:
            N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
            self.driver_version = _text(N.nvmlSystemGetDriverVersion())
            self.nvml_version = _text(N.nvmlSystemGetNVMLVersion())
        except N.NVMLError as e:
            self.count("nvmlInit", e.value)
            why = f"NVML init failed: {e} ({code_name(e.value)})"
            raise DriverGone(why, "nvmlInit", e.value) from None
        self.up = True

    def close(self) -> None:
        """Shut NVML down; harmless when it is already gone."""
        if self.up:
            self.up = False
            with contextlib.suppress(N.NVMLError):
                N.nvmlShutdown()

    def call(self, call: Call, handle: Any = None) -> Any:
        """Run one NVML call (falling back to ``call.fallback`` if the driver or pynvml
        lacks it)."""
        offer()
        try:
            fn = _wrapper(call.function)
            if call.system:
                return fn(*call.args)
            return fn(handle, *call.args)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_FUNCTION_NOT_FOUND and call.fallback is not None:
                return self.call(call.fallback, handle)
            raise self._failure(call.function, e) from None

    def run(self, function: str, *args: Any, empty: Collection[int] = ()) -> Any:
        """``pynvml.<function>(*args)``; a failure is counted and raised as an NvmlProblem.

        ``empty``: codes that are NVML's way of answering "nothing here" (a gap in
        the MIG device index space, a wait that timed out): for those the result
        is None and nothing is counted.
        """
        offer()
        try:
            return _wrapper(function)(*args)
        except N.NVMLError as e:
            if e.value in empty:
                return None
            raise self._failure(function, e) from None

    def c_call(self, function: str, *args: Any, empty: Collection[int] = ()) -> bool:
        """NVML's C function ``function`` called with ctypes arguments the caller prepared.

        For the few calls made hundreds of times a cycle, whose pynvml wrapper
        costs more than the call (it builds and fills a new structure each
        time). pynvml still loads the library and finds the function; a failure
        is counted and raised exactly as :meth:`run` does, and for ``empty``
        codes the answer is False and nothing is counted.
        """
        offer()
        try:
            ret = N._nvmlGetFunctionPointer(function)(*args)
        except N.NVMLError as e:  # the library is not loaded or lacks the function
            raise self._failure(function, e) from None
        if ret == N.NVML_SUCCESS:
            return True
        if ret in empty:
            return False
        raise self._failure(function, N.NVMLError(ret))

    def release(self, function: str, *args: Any) -> None:
        """Free an NVML object, best effort: a failure is neither raised nor counted
        (a reloaded driver no longer knows objects of the old one)."""
        with contextlib.suppress(N.NVMLError):
            getattr(N, function)(*args)

    def _failure(self, function: str, e: N.NVMLError) -> NvmlProblem:
        """Count an NVML error and turn it into the exception a caller acts on."""
        code = e.value
        self.count(function, code)
        kind: type[NvmlProblem] = CallFailed
        if code in _UNAVAILABLE:
            kind = Unavailable
        elif code in _LOST:
            kind = DeviceLost
        elif code in _DRIVER:
            self.up = False
            kind = DriverGone
        return kind(f"{function}: {code_name(code)}", function, code)

    def count(self, function: str, code: int) -> None:
        """Count one failed call (gpu_exporter_nvml_errors_total)."""
        with self._lock:
            self.errors[(function, code_name(code))] += 1

    def unsupported_field(self, name: str, where: str, why: str) -> None:
        """Record a field a device cannot serve: logged at debug once per field, all GPUs."""
        with self._lock:
            if name in self.unsupported:
                return
            self.unsupported[name] = f"{where}: {why}"
        log.debug("%s not available on %s: %s; omitted", name, where, why)

    def summarize_unsupported(self) -> None:
        """Log, once (after the first cycle), in one line, the fields some device cannot serve."""
        with self._lock:
            if self._summarized:
                return
            self._summarized = True
            names = sorted(self.unsupported)
        if names:
            shown = ", ".join(names[:_NAMED])
            more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
            log.info(
                "%d enabled field(s) not available on at least one GPU; omitted there: "
                "%s%s (--log-level debug names the GPU and NVML's reason)",
                len(names),
                shown,
                more,
            )

    def error_counts(self) -> tuple[tuple[str, str, int], ...]:
        with self._lock:
            return tuple((f, c, n) for (f, c), n in sorted(self.errors.items()))


def _wrapper(function: str) -> Any:
    """pynvml's wrapper of an NVML function; a pynvml release without it answers as a
    driver without the function does (FUNCTION_NOT_FOUND), so fallbacks apply."""
    fn = getattr(N, function, None)
    if fn is None:
        raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
    return fn


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
