"""The DCGM families, with dcgm-exporter's names and labels, from one snapshot.

Each catalog row becomes one family. Rows read as plain values go through
:func:`values`; a row that needs more (the XID rows) names its own family
function in ``SPECIAL`` by source or in ``BY_NAME`` by metric name. A family
function takes the row and the cycle's :class:`Frame` and returns sample lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.catalog import Catalog, MetricSpec
from exporter.exposition import text
from exporter.exposition.xid import XidSeries, describe
from exporter.nvml.devices import Device
from exporter.nvml.fields import Scope, Source
from exporter.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Frame:
    """What a family function reads: the snapshot, label text, and the XID counter's series."""

    snap: Snapshot
    series_labels: Mapping[str, str]  # device key -> its labels, plus its holder's if one
    device_text: Callable[[Device], str]  # a device's own labels (gone devices included)
    xids: Sequence[XidSeries]
    holder_text: Callable[..., str]

    def labels(self, dev: Device) -> str:
        """The labels of a device's series: its own, plus its holder's when one holds it."""
        return self.series_labels[dev.key]


Family = Callable[[MetricSpec, Frame], list[str]]


def values(spec: MetricSpec, fr: Frame) -> list[str]:
    """A field read per device: physical GPUs (device scope) or whole GPUs and MIG instances."""
    snap = fr.snap
    devices = snap.gpus if spec.field.scope is Scope.DEVICE else snap.entities
    name, labels, num, readings = spec.name, fr.series_labels, text.num, snap.values
    key = spec.field.name  # readings are keyed by DCGM field; ``name`` is 1.x's with -o
    out = []
    for dev in devices:  # the hot loop of a cycle: one line per series, written inline
        got = readings.get(dev.key)
        v = got.get(key) if got is not None else None
        if v is not None:
            out.append(f"{name}{{{labels[dev.key]}}} {num(v)}\n")
    return out


def last_xid(spec: MetricSpec, fr: Frame) -> list[str]:
    """DCGM_FI_DEV_XID_ERRORS: the last XID per GPU (0 for none), sticky like dcgm-exporter."""
    last = dict(fr.snap.xid.last)
    out = []
    for gpu in fr.snap.gpus:
        x = last.get(gpu.uuid, 0)
        more = text.join((("err_code", str(x)), ("err_msg", describe(x))))
        out.append(text.sample(spec.name, f"{fr.labels(gpu)},{more}", str(x)))
    return out


def xid_counts(spec: MetricSpec, fr: Frame) -> list[str]:
    """XID counts per device and code (and holder, with pod labels)."""
    out = []
    for s in fr.xids:
        where = fr.device_text(s.device)
        who = f"{fr.holder_text(s.holder)}," if s.holder is not None else ""
        out.append(text.sample(spec.name, f'{where},{who}xid="{s.xid}"', str(s.count)))
    return out


def xid(spec: MetricSpec, fr: Frame) -> list[str]:
    return last_xid(spec, fr) if spec.field.scope is Scope.DEVICE else xid_counts(spec, fr)


SPECIAL: dict[Source, Family] = {Source.XID: xid}
BY_NAME: dict[str, Family] = {}


def render(catalog: Catalog, fr: Frame) -> tuple[str, int]:
    """Text of every catalog family with samples this cycle, and the number of samples."""
    out: list[str] = []
    series = 0
    for spec in catalog.metrics:
        fn = BY_NAME.get(spec.name) or SPECIAL.get(spec.field.source, values)
        lines = fn(spec, fr)
        if lines:
            out.append(text.family(spec.name, spec.help, spec.type, lines))
            series += len(lines)
    return "".join(out), series
