"""Reading the text exposition in tests: samples, golden-file masking, and the stages
that publish a snapshot without a poller."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.catalog.metricsfile import Catalog
from exporter.derive.stage import Derive
from exporter.exposition.build import Builder
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.frame import DeviceUse, Held, Holder, Split, Workloads
from exporter.snapshot import Snapshot

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Values that stay put on a simulated node (limits, sizes, error counters
# without faults); every other value moves over time and is masked.
STATIC = {
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "gpu_exporter_gpus",
    "gpu_exporter_mig_instances",
    "gpu_exporter_gpu_up",
    "gpu_exporter_series",
    "gpu_exporter_collect_interval_seconds",
    "gpu_exporter_nvml_up",
}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def samples(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"not an exposition line: {line!r}"
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append(Sample(m.group(1), labels, float(m.group(3))))
    return out


def find(text: str, name: str, **labels: str) -> list[Sample]:
    return [
        s
        for s in samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def masked(text: str) -> str:
    """The exposition with moving values replaced by <v>; process_* and build info dropped."""
    out = []
    for line in text.splitlines():
        if line.startswith(("process_", "# HELP process_", "# TYPE process_")):
            continue
        if line.startswith("gpu_exporter_build_info") or not line or line.startswith("#"):
            out.append(re.sub(r'python_version="[^"]*"', 'python_version="<py>"', line))
            continue
        name = _LINE.match(line).group(1)
        if name not in STATIC:
            line = line[: line.rindex(" ")] + " <v>"
        out.append(line)
    return "\n".join(out) + "\n"


# GPU accounting's per-holder families: a holder's series outlive it by the retention
HOLDER_FAMILIES = (
    "gpu_exporter_allocated_gpu_seconds_total",
    "gpu_exporter_busy_gpu_seconds_total",
    "gpu_exporter_idle_gpu_seconds_total",
    "gpu_exporter_energy_joules_total",
    "gpu_exporter_activity_energy_joules_total",
)


def without_holders(text: str) -> str:
    """The exposition without the accounting holder families (which keep an ended pod's
    labels for the retention)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith(HOLDER_FAMILIES))


class Stages:
    """A snapshot through the derive stage, then rendered: what ``Poller.publish`` runs
    in the worker thread, without a poller (the stages' public API)."""

    def __init__(self, cfg: Any = None, selfmetrics: SelfMetrics | None = None) -> None:
        self.derive = Derive(cfg)
        self.builder = Builder(selfmetrics or SelfMetrics(1.0), cfg)

    def publish(
        self,
        snap: Snapshot,
        catalog: Catalog,
        holders: Mapping[str, Holder] | None = None,
        splits: Iterable[Split] = (),
        sharers: Mapping[str, tuple[Holder, ...]] | None = None,
        *,
        uses: Mapping[str, DeviceUse] | None = None,
        workloads: Workloads | None = None,
    ) -> int:
        """Derive the cycle's frame and render it; the number of DCGM series."""
        held = Held(holders, tuple(splits), sharers, workloads)
        return self.builder.render(self.derive.cycle(snap, catalog, held, uses), catalog)

    @property
    def text(self) -> str:
        """The DCGM part of the exposition, from the last frame."""
        return self.builder.dcgm_text
