"""Questions about NVML that only a real GPU answers, as probes the device check runs.

Each :class:`Probe` names the question, says what it checks, and has ``run(pynvml,
handle)``, which asks NVML about one GPU and returns a JSON-able answer (it never
raises: :func:`run_all` turns an exception into ``{"error": ...}``). NVML must be
initialised; nothing here changes the GPU (no MIG mode change, no reset, no clock
or power setting). The simulator's answer to each question (exporter/sim) is what
the exporter is tested against; a real answer that differs is a bug in the simulator
first. docs/compatibility.md and the exporter's modules say which answer each
behaviour relies on.

    from tools.devicecheck.nvmlprobes import run_all
    answers = run_all(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALL_LINKS = 0xFFFFFFFF
# field id -> scopeId: ECC (3-6), retired pages (29-31), NVLink totals (38/45/52/59),
# violations (74-81), memory temperature, energy, PCIe replays, NVLink bytes (all links),
# row remapping, POWER_INSTANT, PCIe bytes, NVLink5 counters (all links)
FIELDS = {
    **dict.fromkeys((3, 4, 5, 6, 29, 30, 31, 38, 45, 52, 59), 0),
    **dict.fromkeys((*range(74, 84), 94, 142, 143, 144, 145, 186, 197, 198), 0),
    **dict.fromkeys((138, 139, 213, 214, 215, 219), ALL_LINKS),
}
GPM_METRICS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 21, 30, 40, 50, 60, 61)


@dataclass(frozen=True)
class Probe:
    name: str
    checks: str  # the question, and what in the exporter relies on the answer
    run: Callable[[Any, Any], Any]


def _fields(nv: Any, h: Any, ids: dict[int, int] = FIELDS) -> dict[str, Any]:
    values = nv.nvmlDeviceGetFieldValues(h, list(ids.items()))
    return {
        str(v.fieldId): {
            "return": v.nvmlReturn,
            "type": v.valueType,
            "timestamp_us": v.timestamp,
            "latency_us": v.latencyUsec,
            "bits": v.value.ullVal,
        }
        for v in values
    }


def field_values(nv: Any, h: Any) -> dict[str, Any]:
    return _fields(nv, h)


def pcie_counters(nv: Any, h: Any) -> dict[str, Any]:
    ids = {197: 0, 198: 0}
    first = _fields(nv, h, ids)
    time.sleep(1.0)
    second = _fields(nv, h, ids)
    sampled = {
        name: nv.nvmlDeviceGetPcieThroughput(h, counter)
        for name, counter in (("tx_kb_s", nv.NVML_PCIE_UTIL_TX_BYTES), ("rx_kb_s", 1))
    }
    return {"first": first, "second": second, "nvmlDeviceGetPcieThroughput": sampled}


def gpm_nan(nv: Any, h: Any) -> dict[str, Any]:
    if not nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
        return {"supported": False}
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    try:
        nv.nvmlGpmSampleGet(h, s1)
        time.sleep(1.0)
        nv.nvmlGpmSampleGet(h, s2)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
        mg.sample1, mg.sample2 = s1, s2
        for i, metric in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(mg)
        got = {m.metricId: (m.nvmlReturn, m.value) for m in mg.metrics[: len(GPM_METRICS)]}
    finally:
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)
    return {
        str(k): {"return": r, "value": None if math.isnan(v) else v, "nan": math.isnan(v)}
        for k, (r, v) in got.items()
    }


def _has(nv: Any, symbol: str) -> bool:
    try:
        nv._nvmlGetFunctionPointer(symbol)
    except nv.NVMLError:
        return False
    return True


def process_lists(nv: Any, h: Any) -> dict[str, Any]:
    from exporter.nvml.devices import Device
    from exporter.nvml.proclist import ProcessLists
    from exporter.nvml.session import NvmlProblem, Session

    lists = ProcessLists(Session())
    dev = Device("probe", 0, "probe", "", h, ())
    out: dict[str, Any] = {
        "symbols": {
            s: _has(nv, s)
            for s in (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetConfComputeMemSizeInfo",
                "nvmlDeviceGetRunningProcessDetailList",
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                "nvmlEventSetWait_v2",
                "nvmlEventSetWait_v3",
            )
        },
        "entry_bytes": lists.layout()[1].size,
        "pynvml_compute": [
            (p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
        ],
    }
    for kind in ("Compute", "MPSCompute"):
        try:
            out[kind] = [(p.pid, p.used_bytes, p.gi, p.ci) for p in lists.read(dev, kind)]
        except NvmlProblem as e:
            out[kind] = str(e)
    return out


def process_utilization_sizing(nv: Any, h: Any) -> dict[str, Any]:
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    seen: Counter[str] = Counter()
    for _ in range(100):
        count = ctypes.c_uint(0)
        ret = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        seen[f"{ret}:{count.value}"] += 1
    return {"return:count": dict(seen)}


def xid_event_wait(nv: Any, h: Any) -> dict[str, Any]:
    es = nv.nvmlEventSetCreate()
    try:
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
        try:
            data = nv.nvmlEventSetWait_v2(es, 0)
            got: Any = {"xid": data.eventData, "gi": data.gpuInstanceId}
        except nv.NVMLError as e:
            got = {"return": e.value}
    finally:
        nv.nvmlEventSetFree(es)
    return {"wait_0_ms": got}


def kernel_log(nv: Any, h: Any) -> dict[str, Any]:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return {"readable": False, "error": e.strerror}
    xids: Counter[str] = Counter()
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: overwritten records
                continue
            if b"NVRM: Xid" in record:
                xids[record.split(b"): ", 1)[-1].split(b",", 1)[0].decode(errors="replace")] += 1
    finally:
        os.close(fd)
    return {"readable": True, "xids_since_boot": dict(xids)}


def nvml_holds_the_module(nv: Any, h: Any) -> dict[str, Any]:
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return {"open_device_files": sorted(names & {"/dev/nvidiactl", "/dev/nvidia-uvm"})}


def memory_and_identity(nv: Any, h: Any) -> dict[str, Any]:
    m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    return {
        "total_eq_reserved_used_free": m.total == m.reserved + m.used + m.free,
        "memory": [m.total, m.reserved, m.used, m.free],
        "brand": nv.nvmlDeviceGetBrand(h),
        "architecture": nv.nvmlDeviceGetArchitecture(h),
        "mig_mode": nv.nvmlDeviceGetMigMode(h),
        "ecc_mode": nv.nvmlDeviceGetEccMode(h),
    }


PROBES = (
    Probe("field_values", "per-entry return, value type, time stamp and latency of every "
          "field id the exporter reads (INVALID_ARGUMENT for ids the driver lacks? ECC "
          "entries untouched with ECC off? NVLink5 counters on Blackwell?)", field_values),
    Probe("pcie_counters", "fields 197/198 twice 1 s apart beside nvmlDeviceGetPcieThroughput: "
          "counter width and unit of DCGM_FI_DEV_PCIE_*_THROUGHPUT", pcie_counters),
    Probe("gpm_nan", "every GPM metric over 1 s: which are NaN on this GPU now (left out), "
          "which NOT_SUPPORTED (NVDEC/NVJPG/NVOFA, DMMA)", gpm_nan),
    Probe("process_lists", "the process-entry layout the exporter picks from the driver's "
          "symbols, its lists against pynvml's, MPS clients", process_lists),
    Probe("process_utilization_sizing", "nvmlDeviceGetProcessUtilization with no buffer, 100 "
          "times: does it answer INSUFFICIENT_SIZE with a count of 0?",
          process_utilization_sizing),
    Probe("xid_event_wait", "an XID event set on this GPU answers a 0 ms wait (TIMEOUT "
          "when idle)", xid_event_wait),
    Probe("kernel_log", "/dev/kmsg readable here, and the XIDs the driver logged since boot "
          "(compare with DCGM_EXP_XID_ERRORS_TOTAL)", kernel_log),
    Probe("nvml_holds_the_module", "an initialised NVML keeps /dev/nvidiactl open (the "
          "module cannot unload under the exporter)", nvml_holds_the_module),
    Probe("memory_and_identity", "memory v2 adds up (total = reserved + used + free); brand, "
          "architecture, MIG and ECC modes", memory_and_identity),
)  # fmt: skip


def run_all(nv: Any, handle: Any) -> dict[str, Any]:
    """Every probe's answer by name; a probe that raised answers ``{"error": ...}``."""
    out: dict[str, Any] = {}
    for probe in PROBES:
        try:
            out[probe.name] = probe.run(nv, handle)
        except Exception as e:  # a probe must not stop the others
            out[probe.name] = {"error": f"{type(e).__name__}: {e}"}
    return out
