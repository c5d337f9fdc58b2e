"""Questions about NVML a real GPU settles (the "real-GPU tests" of the NVML review).

Each probe only reads: no setting is changed, nothing is reset, no process is started.
A probe that cannot run on this node (no MIG, no running process, ECC on everywhere)
says so instead of answering. On the simulator the answers are the simulator's beliefs
and are labelled as such by the report.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml as N

from exporter.nvml.fabric import VERSIONS, FabricInfo, FabricInfoLegacy
from exporter.nvml.fields import FIELDS, Source
from exporter.nvml.session import code_name as _code

Probe = dict[str, Any]
_GPM_METRICS = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 20, 21, 60, 61)


def code_name(code: int) -> str:
    return "SUCCESS" if code == N.NVML_SUCCESS else _code(code)


def _handles() -> list[Any]:
    return [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]


def _fields(h: Any, ids: list[tuple[int, int]]) -> list[tuple[int, str, int, int, int]]:
    """(field id, nvmlReturn name, valueType, timestamp set, latencyUsec) per id."""
    got = N.nvmlDeviceGetFieldValues(h, ids)
    return [
        (v.fieldId, code_name(v.nvmlReturn), v.valueType, int(v.timestamp != 0), v.latencyUsec)
        for v in got
    ]


def pcie_counters() -> Probe:
    """#6: do field ids 197/198 exist, and do they agree with nvmlDeviceGetPcieThroughput?"""
    h = _handles()[0]
    first = N.nvmlDeviceGetFieldValues(h, [(197, 0), (198, 0)])
    codes = [code_name(v.nvmlReturn) for v in first]
    detail = f"197/198 answer {codes}, valueType {[v.valueType for v in first]}"
    if codes != ["SUCCESS", "SUCCESS"]:
        return {"answer": "fields 197/198 not served by this driver", "detail": detail}
    time.sleep(1.0)
    second = N.nvmlDeviceGetFieldValues(h, [(197, 0), (198, 0)])
    dt = (second[0].timestamp - first[0].timestamp) / 1e6 or 1.0
    rates = [
        (b.value.ullVal - a.value.ullVal) / dt / 1024 for a, b in zip(first, second, strict=True)
    ]
    tx = N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES)
    rx = N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES)
    detail += f"; over {dt:.2f} s: TX {rates[0]:.0f} KB/s, RX {rates[1]:.0f} KB/s"
    detail += f"; nvmlDeviceGetPcieThroughput TX {tx} KB/s, RX {rx} KB/s (20 ms)"
    return {"answer": "fields 197/198 served", "detail": detail}


def ecc_disabled() -> Probe:
    """#7: what do the ECC fields answer on a GPU with ECC off?"""
    for h in _handles():
        try:
            current, _ = N.nvmlDeviceGetEccMode(h)
        except N.NVMLError as e:
            return {"answer": f"ECC mode not readable ({e})", "detail": ""}
        if not current:
            got = _fields(h, [(i, 0) for i in (3, 4, 5, 6, 29, 30, 31)])
            return {"answer": "a GPU with ECC off", "detail": f"(id, ret, type, ts, lat): {got}"}
    return {"answer": "not settled: ECC is on on every GPU", "detail": ""}


def gpm_nan() -> Probe:
    """#10: does GPM answer NaN for any metric (idle GPU)?"""
    for h in _handles():
        if not N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            continue
        a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        try:
            N.nvmlGpmSampleGet(h, a)
            time.sleep(1.0)
            N.nvmlGpmSampleGet(h, b)
            got = _gpm_metrics(a, b)
        finally:
            N.nvmlGpmSampleFree(a)
            N.nvmlGpmSampleFree(b)
        nan = [m for m, (ret, v) in got.items() if ret == "SUCCESS" and math.isnan(v)]
        return {"answer": f"NaN for metrics {nan}" if nan else "no NaN", "detail": str(got)}
    return {"answer": "not settled: no GPU with GPM", "detail": ""}


def _gpm_metrics(a: Any, b: Any) -> dict[int, tuple[str, float]]:
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(_GPM_METRICS)
    mg.sample1, mg.sample2 = a, b
    for i, m in enumerate(_GPM_METRICS):
        mg.metrics[i].metricId = m
    N.nvmlGpmMetricsGet(mg)
    return {
        m: (code_name(mg.metrics[i].nvmlReturn), mg.metrics[i].value)
        for i, m in enumerate(_GPM_METRICS)
    }


def mig_process_memory() -> Probe:
    """#11: is a process's memory on a MIG instance reported, or NVML_VALUE_NOT_AVAILABLE?"""
    seen: Counter[str] = Counter()
    for h in _handles():
        try:
            count = N.nvmlDeviceGetMaxMigDeviceCount(h)
        except N.NVMLError:
            continue
        for i in range(count):
            try:
                mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except N.NVMLError:
                continue
            for p in N.nvmlDeviceGetComputeRunningProcesses(mig):
                seen["not available" if p.usedGpuMemory is None else "bytes"] += 1
    if not seen:
        return {"answer": "not settled: no process on a MIG instance", "detail": ""}
    return {"answer": dict(seen), "detail": "usedGpuMemory of processes on MIG instances"}


def mps_processes() -> Probe:
    """#11: does the node list MPS clients apart from compute processes?"""
    lines = []
    for i, h in enumerate(_handles()):
        compute = len(N.nvmlDeviceGetComputeRunningProcesses(h))
        try:
            mps: Any = len(N.nvmlDeviceGetMPSComputeRunningProcesses(h))
        except N.NVMLError as e:
            mps = code_name(e.value)
        except N.NVMLLibraryMismatchError:  # pynvml's answer when the driver lacks _v3
            mps = "FUNCTION_NOT_FOUND"
        lines.append(f"GPU {i}: compute {compute}, MPS {mps}")
    return {"answer": "; ".join(lines[:8]), "detail": "no MPS daemon is started by the check"}


def kmsg_xids() -> Probe:
    """#1: can this process read the kernel log, and which XIDs does it hold?"""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return {"answer": f"/dev/kmsg not readable ({e.strerror})", "detail": ""}
    xids: Counter[str] = Counter()
    try:
        for _ in range(100_000):
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:
                continue  # a record overwritten while reading (EPIPE)
            if "NVRM: Xid" in record:
                xids[record.split(",")[1].strip() if record.count(",") >= 2 else "?"] += 1
    finally:
        os.close(fd)
    return {"answer": "/dev/kmsg readable", "detail": f"NVRM Xid records by code: {dict(xids)}"}


def blackwell_nvlink_errors() -> Probe:
    """#12: which NVLink error fields answer (38/45/52/59 at scope 0, NVLink5 counts)?"""
    out = []
    for i, h in enumerate(_handles()):
        if N.nvmlDeviceGetArchitecture(h) < N.NVML_DEVICE_ARCH_BLACKWELL:
            continue
        old = _fields(h, [(f, 0) for f in (38, 45, 52, 59)])
        new = _fields(h, [(f, 0xFFFFFFFF) for f in (213, 214, 215, 219)])
        out.append(f"GPU {i}: {[x[:2] for x in old]} {[x[:2] for x in new]}")
    return {"answer": "; ".join(out) or "not settled: no Blackwell GPU", "detail": ""}


def field_types() -> Probe:
    """#16/#21: return code and valueType of every field id the exporter asks for."""
    ids = sorted({fid for f in FIELDS.values() if f.source is Source.FIELD for fid in f.field_ids})
    got = _fields(_handles()[0], ids)
    return {
        "answer": f"{sum(g[1] == 'SUCCESS' for g in got)} of {len(got)} answered",
        "detail": str(got),
    }


def memory_adds_up() -> Probe:
    """Section 4: does total == reserved + used + free (nvmlMemory_v2)?"""
    lines = []
    for i, h in enumerate(_handles()):
        m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
        lines.append(f"GPU {i}: {m.total - (m.reserved + m.used + m.free)} bytes off")
    return {"answer": "; ".join(lines[:8]), "detail": "total - (reserved + used + free)"}


def process_utilization_sizing() -> Probe:
    """#15: what does the sizing call (NULL buffer, count 0) answer, 100 times?"""
    fn = N._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    seen: Counter[tuple[str, int]] = Counter()
    h = _handles()[0]
    for _ in range(100):
        count = ctypes.c_uint(0)
        ret = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        seen[(code_name(ret), count.value)] += 1
    return {"answer": str(dict(seen)), "detail": "(return, count) of 100 sizing calls"}


def fabric_versions() -> Probe:
    """Which fabric info structures the driver answers, and the state it reports."""
    lines = []
    for i, h in enumerate(_handles()):
        got = []
        for version, code in VERSIONS.items():
            buf = FabricInfo()
            buf.version = code
            ret = _call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(buf))
            got.append(f"v{version} {ret}" + (f" state {buf.state}" if ret == "SUCCESS" else ""))
        legacy = FabricInfoLegacy()
        got.append(f"v1 {_call('nvmlDeviceGetGpuFabricInfo', h, ctypes.byref(legacy))}")
        lines.append(f"GPU {i}: {', '.join(got)}")
    return {"answer": "; ".join(lines[:8]), "detail": ""}


def nvidiactl_held() -> Probe:
    """#3: does an initialised NVML hold /dev/nvidiactl open (pinning the driver)?"""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            held.append(target)
    return {
        "answer": f"held: {sorted(set(held))}" if held else "no /dev/nvidia* open",
        "detail": "",
    }


def _call(name: str, *args: Any) -> str:
    try:
        return code_name(N._nvmlGetFunctionPointer(name)(*args))
    except N.NVMLError as e:
        return code_name(e.value)


PROBES: tuple[tuple[str, Callable[[], Probe]], ...] = (
    ("1 XIDs in the kernel log", kmsg_xids),
    ("3 NVML holds the driver", nvidiactl_held),
    ("6 PCIe byte counters 197/198", pcie_counters),
    ("7 ECC fields with ECC off", ecc_disabled),
    ("10 GPM NaN", gpm_nan),
    ("11 process memory on MIG", mig_process_memory),
    ("11 MPS clients", mps_processes),
    ("12 NVLink errors on Blackwell", blackwell_nvlink_errors),
    ("15 process utilization sizing", process_utilization_sizing),
    ("16 field value types", field_types),
    ("4 memory adds up", memory_adds_up),
    ("14 fabric info versions", fabric_versions),
)


def run_all() -> list[Probe]:
    """Every probe's answer; a probe that fails records its error and the rest go on."""
    out = []
    for name, probe in PROBES:
        try:
            got = probe()
        except Exception as e:
            got = {"answer": f"probe failed: {type(e).__name__}: {e}", "detail": ""}
        out.append({"item": name, "question": (probe.__doc__ or "").strip(), **got})
    return out
