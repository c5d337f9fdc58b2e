"""The self-metrics part of the exposition: prometheus-client's process metrics and the
exporter's own families, rendered from a private registry."""

from __future__ import annotations

import math
import resource
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.catalog.metricsfile import Skipped
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

ROOT = Path(__file__).parents[2]
PROCESS = {
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
}


def _families(sm: SelfMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(sm.render().decode())}


def test_render_is_valid_and_starts_with_process_metrics():
    sm = SelfMetrics(15.0)
    sm.collections.update(success=3, failure=1)
    sm.nvml_errors = (("nvmlDeviceGetFanSpeed", "NOT_SUPPORTED", 8),)
    got = sm.render().decode()
    assert got.startswith("# HELP process_")
    fams = _families(sm)
    assert set(fams) >= PROCESS
    assert fams["gpu_exporter_collect_interval_seconds"].samples[0].value == 15.0
    by_result = {s.labels["result"]: s.value for s in fams["gpu_exporter_collections"].samples}
    assert by_result == {"success": 3.0, "failure": 1.0, "skipped": 0.0}
    errors = fams["gpu_exporter_nvml_errors"].samples
    assert [(s.labels, s.value) for s in errors] == [
        ({"function": "nvmlDeviceGetFanSpeed", "code": "NOT_SUPPORTED"}, 8.0)
    ]
    # one HELP and one TYPE per family: the text format allows no more
    heads = [ln.split()[1:3] for ln in got.splitlines() if ln.startswith("#")]
    assert len(heads) == len({tuple(h) for h in heads}) == 2 * len(fams)


def test_process_metrics_are_this_process():
    """The values a user would check with ps and ulimit (the kernel, not our code)."""
    fams = _families(SelfMetrics(1.0))
    value = {n: fams[n].samples[0].value for n in PROCESS}
    assert value["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize()
    assert abs(value["process_resident_memory_bytes"] - rss) < 8 * 1024 * 1024
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert abs(value["process_cpu_seconds"] - (usage.ru_utime + usage.ru_stime)) < 0.5
    started = value["process_start_time_seconds"]
    assert started <= time.time() and time.time() - started < 3600
    assert math.isclose(
        value["process_open_fds"], len(list(Path("/proc/self/fd").iterdir())), abs_tol=3
    )


def test_skipped_rows_follow_the_info_pattern():
    sm = SelfMetrics(1.0)
    sm.skipped_rows = (Skipped("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 47, "no NVML source"),)
    (s,) = _families(sm)["gpu_exporter_metrics_file_skipped_row"].samples
    assert (s.labels, s.value) == ({"field": "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "line": "47"}, 1)


def _gpu(i: int, host: tuple[str, str] | None) -> Device:
    labels = [
        ("gpu", str(i)), ("UUID", f"GPU-{i}"), ("pci_bus_id", f"00000000:{i:02X}:00.0"),
        ("device", f"nvidia{i}"), ("modelName", "NVIDIA H100 80GB HBM3"),
    ]  # fmt: skip
    if host:
        labels.append(host)
    labels.append(("DCGM_FI_DRIVER_VERSION", "580.95.05"))
    return Device(f"GPU-{i}", i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", None, tuple(labels))


def test_gpu_up_labels_are_snake_case_whatever_the_host_label():
    for host in (("Hostname", "n1"), ("hostname", "n1"), None):
        sm = SelfMetrics(1.0)
        sm.snapshot = Snapshot(0.0, 0.1, gpus=(_gpu(0, host),), down=(_gpu(1, host),))
        ups = _families(sm)["gpu_exporter_gpu_up"].samples
        want = {"gpu": "0", "uuid": "GPU-0", "pci_bus_id": "00000000:00:00.0",
                "device": "nvidia0", "model_name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
        if host:
            want["hostname"] = "n1"
        assert (ups[0].labels, ups[0].value) == (want, 1.0), host
        assert (ups[1].labels["uuid"], ups[1].value) == ("GPU-1", 0.0)


def test_nothing_registers_on_prometheus_clients_global_registry():
    """The registry is private: a program importing the exporter keeps its own
    REGISTRY as it was (no second set of process_* metrics)."""
    code = (
        "from prometheus_client import REGISTRY; "
        "names = lambda: sorted(m.name for m in REGISTRY.collect()); before = names(); "
        "import exporter.app, exporter.cli; "
        "from exporter.exposition.selfmetrics import SelfMetrics; SelfMetrics(1.0).render(); "
        "print(names() == before or names())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True", out.stderr
