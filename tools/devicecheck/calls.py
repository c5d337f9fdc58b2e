"""Every NVML C call the exporter makes: its cost, its answer per device, and replays.

``Recorder`` stands in front of ``pynvml.nvmlLib`` (the real libnvidia-ml or the
simulated library alike): pynvml looks each C function up by name on it, and gets the
function wrapped with a timer that notes the return code per device handle and, for
``nvmlDeviceGetFieldValues``, each field id's own return code. ``costs`` then replays
recorded calls of the read-only functions (getters only: nothing is set, created, freed
or reset) until each has ``n`` timings, and reports median and p99 in microseconds, in
the shape of the simulator's latency model (exporter/sim/latency.py).
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pynvml as N

from benchmarks.stats import fit

# Read-only calls that may be replayed with their recorded arguments. Left out: GPM
# sample calls (a sample freed since would be used after free), waits (they block), and
# calls that fill an array whose size travels in an in/out count (a count NVML raised in
# an INSUFFICIENT_SIZE answer would let the next call write past the recorded array).
_REPLAY_PREFIXES = ("nvmlDeviceGet", "nvmlSystemGet", "nvmlDeviceIsMigDeviceHandle")
_NEVER = ("nvmlEventSetWait", "nvmlErrorString")
_ARRAYS = ("Processes", "ProcessUtilization", "RetiredPages", "Samples", "Sessions", "Pids",
           "Supported", "Nearest", "Active")  # fmt: skip
_UNWRAPPED = frozenset({"nvmlErrorString"})  # pynvml sets its restype
_SAMPLES_KEPT = 16  # argument tuples kept per function for replays


def handle_key(handle: Any) -> int:
    """The address a device handle points at (how calls on one device are grouped)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return 0


class Recorder:
    """A stand-in for ``pynvml.nvmlLib`` that times and notes every call."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self.times: dict[str, list[float]] = defaultdict(list)  # seconds per call
        self.codes: dict[tuple[str, int], Counter[int]] = defaultdict(Counter)
        self.field_codes: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
        self.samples: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self.field_calls: list[tuple[int, float]] = []  # (field ids asked, seconds)
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._lib, name)  # AttributeError: pynvml reports FUNCTION_NOT_FOUND
        if name in _UNWRAPPED or not name.startswith("nvml"):
            return fn
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            wrapped = self._wrapped[name] = self._wrap(name, fn)
        return wrapped

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter
        device = name.startswith(("nvmlDevice", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet"))
        fields = name == "nvmlDeviceGetFieldValues"

        def call(*args: Any) -> Any:
            t0 = clock()
            ret = fn(*args)
            spent = clock() - t0
            key = handle_key(args[0]) if device and args else 0
            with self._lock:
                self.times[name].append(spent)
                self.codes[(name, key)][int(ret)] += 1
                kept = self.samples[name]
                if len(kept) < _SAMPLES_KEPT:
                    kept.append(args)
                if fields and ret == N.NVML_SUCCESS:
                    self.field_calls.append((self._entries(key, args), spent))
            return ret

        return call

    def _entries(self, key: int, args: tuple[Any, ...]) -> int:
        """Note each field id's own return code of an answered nvmlDeviceGetFieldValues;
        returns how many ids it asked for."""
        count = args[1] if type(args[1]) is int else args[1].value
        target = getattr(args[2], "_obj", args[2])
        entries = (N.c_nvmlFieldValue_t * count).from_address(ctypes.addressof(target))
        get = object.__getattribute__
        for e in entries:
            self.field_codes[(key, get(e, "fieldId"))][get(e, "nvmlReturn")] += 1
        return count

    def per_field(self) -> tuple[float, float] | None:
        """nvmlDeviceGetFieldValues' cost as (base, per field id) in us, fitted over calls
        of different sizes (None when every call asked for the same number)."""
        calls = list(self.field_calls)
        if len({n for n, _ in calls}) < 2:
            return None
        base, slope, _ = fit([float(n) for n, _ in calls], [t * 1e6 for _, t in calls])
        return base, slope

    def install(self) -> None:
        """Put the recorder in front of the library pynvml has loaded."""
        with N.libLoadLock:
            N.nvmlLib = self
            N._nvmlGetFunctionPointer_cache.clear()

    def uninstall(self) -> None:
        with N.libLoadLock:
            if N.nvmlLib is self:
                N.nvmlLib = self._lib
            N._nvmlGetFunctionPointer_cache.clear()

    def replay(self, n: int, budget_s: float = 30.0) -> None:
        """Call each replayable function with its recorded arguments until it has ``n``
        timings (or ``budget_s`` is spent on all of them)."""
        end = time.monotonic() + budget_s
        for name in sorted(self.samples):
            if not name.startswith(_REPLAY_PREFIXES) or name.startswith(_NEVER):
                continue
            if any(part in name for part in _ARRAYS):
                continue
            fn = self._wrapped[name]
            kept = list(self.samples[name])
            i = 0
            while len(self.times[name]) < n and time.monotonic() < end:
                fn(*kept[i % len(kept)])
                i += 1

    def costs(self) -> dict[str, dict[str, float]]:
        """Per function: calls timed, median and p99 in microseconds."""
        out = {}
        for name, times in sorted(self.times.items()):
            if name.startswith("nvmlEventSetWait"):
                continue  # a wait, not a cost
            us = sorted(t * 1e6 for t in times)
            p99 = us[min(len(us) - 1, int(0.99 * len(us)))]
            out[name] = {"calls": len(us), "median_us": statistics.median(us), "p99_us": p99}
        return out

    def codes_for(self, name: str, keys: set[int]) -> Counter[int]:
        """Return codes of ``name`` on the devices ``keys`` (all devices when empty)."""
        got: Counter[int] = Counter()
        for (fn, key), codes in self.codes.items():
            if fn == name and (not keys or key in keys):
                got.update(codes)
        return got

    def field_codes_for(self, fid: int, keys: set[int]) -> Counter[int]:
        got: Counter[int] = Counter()
        for (key, f), codes in self.field_codes.items():
            if f == fid and key in keys:
                got.update(codes)
        return got


def latency_model(costs: dict[str, dict[str, float]], per_field: tuple[float, float] | None) -> str:
    """The measured medians as a fleet file's ``latency:`` section (docs/simulator.md): each
    function's median, nvmlDeviceGetFieldValues as its fitted base plus a cost per field id,
    and the median of all functions for the ones not measured."""
    medians = {k: v["median_us"] for k, v in costs.items()}
    default = statistics.median(medians.values()) if medians else 5.0
    slope = 1.0
    if per_field is not None and "nvmlDeviceGetFieldValues" in medians:
        medians["nvmlDeviceGetFieldValues"] = max(per_field[0], 0.1)
        slope = max(per_field[1], 0.0)
    lines = [
        "latency:",
        "  enabled: true",
        f"  default_us: {default:.1f}",
        f"  per_field_us: {slope:.2f}",
        "  functions:",
    ]
    lines += [f"    {name}: {us:.1f}" for name, us in sorted(medians.items())]
    return "\n".join(lines) + "\n"
