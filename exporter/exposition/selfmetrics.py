"""The exporter's own metrics (prefix ``gpu_exporter_``), rendered with each snapshot.

Families come from the latest cycle's state; prometheus-client writes them after its
standard process metrics (families.py). Staleness is left to PromQL:
``time() - gpu_exporter_last_collection_success_timestamp_seconds``.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from exporter import __version__
from exporter.catalog.metricsfile import Skipped
from exporter.exposition import text
from exporter.exposition.families import Family, Registry, counter
from exporter.frame import KubeStatus
from exporter.nvml.devices import Device
from exporter.snapshot import CollectorResult, Snapshot

PREFIX = "gpu_exporter"


class SelfMetrics:
    """Holds what the families report; :meth:`render` is called by the poller once per cycle."""

    def __init__(self, interval_s: float, kube: Callable[[], KubeStatus] | None = None) -> None:
        self.interval_s = interval_s
        self.kube = kube
        self.collections: Counter[str] = Counter()
        self.step_failures: Counter[str] = Counter()  # cycle steps that raised (poller.py)
        self.last_success = 0.0
        self.series = 0
        # job and container copies left out at their budget; None: neither is configured
        self.copies_dropped: int | None = None
        self.snapshot: Snapshot | None = None
        self.nvml_up = False
        self.driver_version = ""
        self.nvml_version = ""
        self.nvml_errors: tuple[tuple[str, str, int], ...] = ()
        self.extra_results: tuple[CollectorResult, ...] = ()
        self.skipped_rows: tuple[Skipped, ...] = ()  # metrics-file rows not served
        # config files' last loads: (kind, ok, unix time of the last success); signals.py
        self.reloads: Callable[[], Iterable[tuple[str, bool, float]]] = tuple
        self._registry = Registry(self.collect)

    def render(self) -> bytes:
        """The self-metrics in the Prometheus text format (UTF-8), process metrics first."""
        return self._registry.render()

    def collect(self) -> Iterator[Family]:
        """The exporter's own families from the current state."""
        p = PREFIX
        info = Family(
            f"{p}_build_info",
            "Build and driver information; value is 1.",
            labels=["version", "python_version", "driver_version", "nvml_version"],
        )
        info.add(
            [__version__, platform.python_version(), self.driver_version, self.nvml_version], 1
        )
        yield info
        yield Family(
            f"{p}_collect_interval_seconds", "Configured collection interval.", self.interval_s
        )
        yield Family(f"{p}_nvml_up", "1 when NVML is initialised and answering.", int(self.nvml_up))
        yield Family(
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
            f"{p}_cycle_step_failures",
            "Steps of a collection cycle that raised an error, by step; the last good "
            "exposition stayed in place.",
            ["step"],
            [((step,), self.step_failures[step]) for step in ("collect", "attribution", "publish")],
        )
        yield _counter(
            f"{p}_nvml_errors",
            "NVML calls that failed, by function and NVML error code.",
            ["function", "code"],
            [((fn, code), n) for fn, code, n in self.nvml_errors],
        )
        yield Family(f"{p}_series", "DCGM series in the last rendered exposition.", self.series)
        if self.copies_dropped is not None:
            yield Family(
                f"{p}_series_copies_dropped",
                "Label sets of container and HPC job copies left out of the last exposition "
                "at their budget (each is one series per field of its device).",
                self.copies_dropped,
            )
        skipped = Family(
            f"{p}_metrics_file_skipped_row",
            "A metrics-file row this exporter does not serve, by field and line of the "
            "file; value is 1 (gpu-exporter --check says why).",
            labels=["field", "line"],
        )
        for row in self.skipped_rows:
            skipped.add([row.name, str(row.line)], 1)
        if self.skipped_rows:
            yield skipped
        yield from _reload_families(tuple(self.reloads()))
        if self.kube is not None:
            yield from _kube_families(self.kube())
        snap = self.snapshot
        if snap is None:
            return
        yield Family(
            f"{p}_collection_duration_seconds",
            "Wall time of the last collection cycle.",
            snap.duration,
        )
        ok = Family(
            f"{p}_collector_success",
            "1 when the collector succeeded in the last cycle.",
            labels=["collector"],
        )
        dur = Family(
            f"{p}_collector_duration_seconds",
            "Seconds the collector spent in the last cycle.",
            labels=["collector"],
        )
        for r in snap.collectors + self.extra_results:
            ok.add([r.name], int(r.success))
            dur.add([r.name], r.duration)
        yield ok
        yield dur
        yield Family(f"{p}_gpus", "Physical GPUs reporting in the last cycle.", len(snap.gpus))
        yield Family(
            f"{p}_mig_instances",
            "MIG instances reporting in the last cycle.",
            sum(1 for d in snap.entities if d.is_mig),
        )
        up = None
        for dev, value in [(d, 1) for d in snap.gpus] + [(d, 0) for d in snap.down]:
            labels = _gpu_up_labels(dev)
            if up is None:
                up = Family(
                    f"{p}_gpu_up",
                    "1 when the GPU answered in the last cycle; 0 when it was seen before "
                    "and is now lost or set aside.",
                    labels=list(labels),
                )
            up.add([labels.get(k, "") for k in up.labels], value)
        if up is not None:
            yield up
        yield from _stopped_family(snap)


def _reload_families(reloads: tuple[tuple[str, bool, float], ...]) -> Iterator[Family]:
    """Config files (metrics file, web config): did the last load succeed, and when did one."""
    if not reloads:
        return
    ok = Family(
        f"{PREFIX}_config_last_reload_successful",
        "1 when the last load of the config file succeeded; 0 when it was refused and the "
        "last good version stays in force.",
        labels=["file"],
    )
    when = Family(
        f"{PREFIX}_config_last_reload_success_timestamp_seconds",
        "Unix time of the last successful load of the config file.",
        labels=["file"],
    )
    for kind, success, at in reloads:
        ok.add([kind], int(success))
        when.add([kind], at)
    yield ok
    yield when


def _counter(
    name: str, help_text: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]
) -> Family:
    """A counter family with one sample per (label values, count) row."""
    c = counter(name, help_text, labels=labels)
    for values, n in rows:
        c.add(values, n)
    return c


def _kube_families(st: KubeStatus) -> Iterator[Family]:
    """Pod attribution: kubelet and API server reachability, unmatched IDs, held devices."""
    yield Family(
        f"{PREFIX}_kubelet_up",
        "1 when the last pod-resources List succeeded.",
        int(st.kubelet_up),
    )
    if st.api_up is not None:
        yield Family(
            f"{PREFIX}_kube_api_up", "1 when the API-server watch is synced.", int(st.api_up)
        )
    yield _counter(
        f"{PREFIX}_unmatched_device_ids",
        "Device IDs in the kubelet's pod-resources answers that matched no GPU or MIG "
        "instance, by resource; every occurrence in every answer counts (one answer per "
        "collection cycle), so an ID that stays unmatched adds 1 each cycle.",
        ["resource"],
        [((resource,), n) for resource, n in st.unmatched],
    )
    yield _counter(
        f"{PREFIX}_kube_inputs_dropped",
        "Items of kubelet or API-server answers dropped at a bound or as invalid, by input.",
        ["input"],
        [((what,), n) for what, n in st.dropped],
    )
    yield counter(
        f"{PREFIX}_kube_mapping_failures",
        "Cycles whose pod mapping failed; the last good pod labels stayed in use.",
        st.mapping_failures,
    )
    yield Family(
        f"{PREFIX}_attributed_devices",
        "GPUs and MIG instances held by at least one container.",
        st.attributed,
    )


def _stopped_family(snap: Snapshot) -> Iterator[Family]:
    """1 for a GPU the exporter no longer calls since a fatal XID (119), 0 for the others."""
    fam = None
    for dev in snap.gpus + snap.down:
        labels = _gpu_up_labels(dev)
        if fam is None:
            fam = Family(
                f"{PREFIX}_gpu_driver_calls_stopped",
                "1 when the exporter stopped calling the driver for the GPU after XID 119 "
                "(GSP timeout), as DCGM does, until the exporter restarts; else 0.",
                labels=list(labels),
            )
        fam.add([labels.get(k, "") for k in fam.labels], int(dev.key in snap.stopped))
    if fam is not None:
        yield fam


def _gpu_up_labels(dev: Device) -> dict[str, str]:
    """A GPU's identity labels under their snake_case names, in dcgm-exporter's order."""
    return dict(text.own_labels(dev.labels, frozenset({"GPU_I_PROFILE", "GPU_I_ID", "GPU_CI_ID"})))
