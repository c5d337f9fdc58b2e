"""The one choke point for NVML calls: init, shutdown, and errors turned into outcomes.

Every call goes through :meth:`Session.call`, which counts failures by function
and code (``gpu_exporter_nvml_errors_total``) and maps NVML's error codes to the
three things a caller acts on: the value is absent on this device
(:class:`Unavailable`), the device is gone (:class:`DeviceLost`), or the driver
is gone and NVML must be re-initialised (:class:`DriverGone`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from typing import Any

import pynvml as N

from exporter.nvml.fields import Call

log = logging.getLogger(__name__)

_UNAVAILABLE = {N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_FUNCTION_NOT_FOUND}
_LOST = {N.NVML_ERROR_GPU_IS_LOST, N.NVML_ERROR_RESET_REQUIRED}
_DRIVER = {
    N.NVML_ERROR_UNINITIALIZED,
    N.NVML_ERROR_DRIVER_NOT_LOADED,
    N.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    N.NVML_ERROR_LIBRARY_NOT_FOUND,
}


class Unavailable(Exception):
    """NVML cannot give this value on this device (NotSupported, or the driver lacks the call)."""


class DeviceLost(Exception):
    """The GPU stopped answering (GPU_IS_LOST, reset required)."""


class DriverGone(Exception):
    """NVML itself is unusable (driver unloaded or replaced); re-initialise."""


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
        """Initialise NVML; raises :class:`DriverGone` with NVML's reason if it cannot."""
        try:
            N.nvmlInit()
            self.driver_version = _text(N.nvmlSystemGetDriverVersion())
            self.nvml_version = _text(N.nvmlSystemGetNVMLVersion())
        except N.NVMLError as e:
            self.count("nvmlInit", e.value)
            raise DriverGone(f"NVML init failed: {e}") from None
        self.up = True

    def close(self) -> None:
        """Shut NVML down; harmless when it is already gone."""
        if self.up:
            self.up = False
            with contextlib.suppress(N.NVMLError):
                N.nvmlShutdown()

    def call(self, call: Call, handle: Any = None) -> Any:
        """Run one NVML call (falling back to ``call.fallback`` if the driver lacks it)."""
        fn = getattr(N, call.function)
        try:
            if call.system:
                return fn(*call.args)
            return fn(handle, *call.args)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_FUNCTION_NOT_FOUND and call.fallback is not None:
                return self.call(call.fallback, handle)
            raise self.failure(call.function, e) from None

    def failure(self, function: str, e: N.NVMLError) -> Exception:
        """Count an NVML error and turn it into the exception a caller acts on."""
        code = e.value
        self.count(function, code)
        if code in _UNAVAILABLE:
            return Unavailable(f"{function}: {code_name(code)}")
        if code in _LOST:
            return DeviceLost(f"{function}: {code_name(code)}")
        if code in _DRIVER:
            self.up = False
            return DriverGone(f"{function}: {code_name(code)}")
        return RuntimeError(f"{function}: {code_name(code)}")

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
        """Log, once (after the first cycle), how many fields some device cannot serve."""
        with self._lock:
            if self._summarized:
                return
            self._summarized = True
            names = sorted(self.unsupported)
        if names:
            log.info(
                "%d enabled field(s) not available on at least one GPU; omitted there "
                "(the list is logged at debug level)",
                len(names),
            )
            log.debug("fields not available: %s", ", ".join(names))

    def error_counts(self) -> tuple[tuple[str, str, int], ...]:
        with self._lock:
            return tuple((f, c, n) for (f, c), n in sorted(self.errors.items()))


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
