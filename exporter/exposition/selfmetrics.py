"""The exporter's own metrics (prefix ``gpu_exporter_``), rendered with each snapshot.

Families come from the latest cycle's state through a private prometheus-client
registry, together with the standard process metrics. Staleness is left to
PromQL: ``time() - gpu_exporter_last_collection_success_timestamp_seconds``.
"""

from __future__ import annotations

import platform
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from exporter import __version__
from exporter.catalog import Skipped
from exporter.nvml.devices import Device
from exporter.snapshot import CollectorResult, Snapshot

if TYPE_CHECKING:
    from exporter.kube.attribution import KubeStatus

PREFIX = "gpu_exporter"
GPU_LABELS = 6  # gpu, UUID, pci_bus_id, device, modelName, Hostname


class SelfMetrics:
    """Holds what the families report; :meth:`render` is called by the poller once per cycle."""

    def __init__(self, interval_s: float, kube: Callable[[], KubeStatus] | None = None) -> None:
        self.interval_s = interval_s
        self.kube = kube
        self.collections: Counter[str] = Counter()
        self.last_success = 0.0
        self.series = 0
        self.snapshot: Snapshot | None = None
        self.nvml_up = False
        self.driver_version = ""
        self.nvml_version = ""
        self.nvml_errors: tuple[tuple[str, str, int], ...] = ()
        self.extra_results: tuple[CollectorResult, ...] = ()
        self.skipped_rows: tuple[Skipped, ...] = ()  # metrics-file rows not served
        # config files' last loads: (kind, ok, unix time of the last success); signals.py
        self.reloads: Callable[[], Iterable[tuple[str, bool, float]]] = tuple
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(self)

    def render(self) -> str:
        """The self-metrics text, process metrics included: prometheus_client's text format,
        written here for the gauges and counters these are (a third of its formatter's
        CPU); anything else goes through its ``generate_latest``."""
        got = text_of(list(self.registry.collect()))
        return got if got is not None else generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        p = PREFIX
        info = GaugeMetricFamily(
            f"{p}_build_info",
            "Build and driver information; value is 1.",
            labels=["version", "python_version", "driver_version", "nvml_version"],
        )
        info.add_metric(
            [__version__, platform.python_version(), self.driver_version, self.nvml_version], 1
        )
        yield info
        yield GaugeMetricFamily(
            f"{p}_collect_interval_seconds", "Configured collection interval.", self.interval_s
        )
        yield GaugeMetricFamily(
            f"{p}_nvml_up", "1 when NVML is initialised and answering.", int(self.nvml_up)
        )
        yield GaugeMetricFamily(
            f"{p}_last_collection_success_timestamp_seconds",
            "Unix time of the last collection cycle that succeeded.",
            self.last_success,
        )
        yield _counter(
            f"{p}_collections",
            "Collection cycles by result.",
            ["result"],
            [((r,), self.collections[r]) for r in ("success", "failure", "skipped")],
        )
        yield _counter(
            f"{p}_nvml_errors",
            "NVML calls that failed, by function and NVML error code.",
            ["function", "code"],
            [((fn, code), n) for fn, code, n in self.nvml_errors],
        )
        yield GaugeMetricFamily(
            f"{p}_series", "DCGM series in the last rendered exposition.", self.series
        )
        skipped = GaugeMetricFamily(
            f"{p}_metrics_file_skipped_row",
            "A metrics-file row this exporter does not serve; value is its line number "
            "(gpu-exporter --check says why).",
            labels=["field"],
        )
        for row in self.skipped_rows:
            skipped.add_metric([row.name], row.line)
        if self.skipped_rows:
            yield skipped
        yield from _reload_families(tuple(self.reloads()))
        if self.kube is not None:
            yield from _kube_families(self.kube())
        snap = self.snapshot
        if snap is None:
            return
        yield GaugeMetricFamily(
            f"{p}_collection_duration_seconds",
            "Wall time of the last collection cycle.",
            snap.duration,
        )
        ok = GaugeMetricFamily(
            f"{p}_collector_success",
            "1 when the collector succeeded in the last cycle.",
            labels=["collector"],
        )
        dur = GaugeMetricFamily(
            f"{p}_collector_duration_seconds",
            "Seconds the collector spent in the last cycle.",
            labels=["collector"],
        )
        for r in snap.collectors + self.extra_results:
            ok.add_metric([r.name], int(r.success))
            dur.add_metric([r.name], r.duration)
        yield ok
        yield dur
        yield GaugeMetricFamily(
            f"{p}_gpus", "Physical GPUs reporting in the last cycle.", len(snap.gpus)
        )
        yield GaugeMetricFamily(
            f"{p}_mig_instances",
            "MIG instances reporting in the last cycle.",
            sum(1 for d in snap.entities if d.is_mig),
        )
        up = None
        for dev, value in [(d, 1) for d in snap.gpus] + [(d, 0) for d in snap.down]:
            if up is None:
                up = GaugeMetricFamily(
                    f"{p}_gpu_up",
                    "1 when the GPU answered in the last cycle; 0 when it was seen before "
                    "and is now lost or set aside.",
                    labels=[k for k, _ in dev.labels[:GPU_LABELS]],
                )
            up.add_metric(_gpu_label_values(dev), value)
        if up is not None:
            yield up


def _reload_families(reloads: tuple[tuple[str, bool, float], ...]) -> Iterator[Metric]:
    """Config files (metrics file, web config): did the last load succeed, and when did one."""
    if not reloads:
        return
    ok = GaugeMetricFamily(
        f"{PREFIX}_config_last_reload_successful",
        "1 when the last load of the config file succeeded; 0 when it was refused and the "
        "last good version stays in force.",
        labels=["file"],
    )
    when = GaugeMetricFamily(
        f"{PREFIX}_config_last_reload_success_timestamp_seconds",
        "Unix time of the last successful load of the config file.",
        labels=["file"],
    )
    for kind, success, at in reloads:
        ok.add_metric([kind], int(success))
        when.add_metric([kind], at)
    yield ok
    yield when


def _counter(
    name: str, help_text: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]
) -> CounterMetricFamily:
    """A counter family with one sample per (label values, count) row."""
    c = CounterMetricFamily(name, help_text, labels=labels)
    for values, n in rows:
        c.add_metric(list(values), n)
    return c


def _kube_families(st: KubeStatus) -> Iterator[Metric]:
    """Pod attribution: kubelet and API server reachability, unmatched IDs, held devices."""
    yield GaugeMetricFamily(
        f"{PREFIX}_kubelet_up",
        "1 when the last pod-resources List succeeded.",
        int(st.kubelet_up),
    )
    if st.api_up is not None:
        yield GaugeMetricFamily(
            f"{PREFIX}_kube_api_up", "1 when the API-server watch is synced.", int(st.api_up)
        )
    yield _counter(
        f"{PREFIX}_unmatched_device_ids",
        "Device IDs from the kubelet that matched no GPU or MIG instance, by resource.",
        ["resource"],
        [((resource,), n) for resource, n in st.unmatched],
    )
    yield _counter(
        f"{PREFIX}_kube_inputs_dropped",
        "Items of kubelet or API-server answers dropped at a bound or as invalid, by input.",
        ["input"],
        [((what,), n) for what, n in st.dropped],
    )
    yield CounterMetricFamily(
        f"{PREFIX}_kube_mapping_failures",
        "Cycles whose pod mapping failed; the last good pod labels stayed in use.",
        st.mapping_failures,
    )
    yield GaugeMetricFamily(
        f"{PREFIX}_attributed_devices",
        "GPUs and MIG instances held by at least one container.",
        st.attributed,
    )


def _gpu_label_values(dev: Device) -> list[str]:
    return [v for _, v in dev.labels[:GPU_LABELS]]


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def text_of(metrics: list[Metric]) -> str | None:
    """What ``generate_latest`` writes for these families, or None when one is other than a
    gauge or counter without timestamps, or has a name it would escape."""
    out = []
    for m in metrics:
        kind, name = m.type, m.name
        if kind == "counter":
            name += "_total"
        elif kind != "gauge":
            return None
        if not _NAME.fullmatch(name):
            return None
        doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for s in m.samples:
            if s.timestamp is not None or s.exemplar is not None or not _NAME.fullmatch(s.name):
                return None
            if s.name == m.name + "_created":
                return None  # prometheus_client moves these into a family of their own
            if not s.labels:
                out.append(f"{s.name} {floatToGoString(s.value)}\n")
                continue
            pairs = []
            for k, v in sorted(s.labels.items()):
                if not _NAME.fullmatch(k):
                    return None
                v = v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
                pairs.append(f'{k}="{v}"')
            out.append(f"{s.name}{{{','.join(pairs)}}} {floatToGoString(s.value)}\n")
    return "".join(out)
