"""The DCGM families, with dcgm-exporter's names and labels, from one snapshot.

Each catalog row becomes one family. Rows read as plain values are written (and
reused while unchanged) by :class:`columns.Reuse`; a row that needs more (the XID
rows, dcgm-exporter's own ``DCGM_EXP_*`` families) names its own family function in
``SPECIAL`` by source or in ``BY_NAME`` by DCGM field name. A family function takes the row and the
cycle's :class:`View` and returns sample lines. Which devices carry series
(``-d/--devices``) is decided once per cycle in :mod:`exporter.exposition.targets`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.catalog.metricsfile import Catalog, MetricSpec
from exporter.catalog.renames import by_new
from exporter.exposition import columns, text
from exporter.exposition.targets import Targets
from exporter.exposition.virtual import Virtual
from exporter.frame import Derived, HealthSeries, WindowCounts, XidSeries
from exporter.nvml.devices import Device
from exporter.nvml.fields import DCGM46, Scope, Source
from exporter.runtime.cpushare import offer
from exporter.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class View:
    """What a family function reads: the snapshot, series devices, label text, derived data."""

    snap: Snapshot
    series_labels: Mapping[str, str]  # device key -> its labels, plus its holder's if one
    device_text: Callable[[Device], str]  # a device's own labels (gone devices included)
    xids: Sequence[XidSeries]
    holder_text: Callable[..., str]
    targets: Targets
    derived: Derived
    # (label text, key of the values) per series of device-level and instance-level fields
    device_rows: Sequence[tuple[str, str]]
    instance_rows: Sequence[tuple[str, str]]
    virtual: Virtual | None  # --kubernetes-virtual-gpus: copies of shared devices
    health_detail: bool  # health_error_severity/_category (dcgm-exporter 4.8.3+)
    # device key -> label text of each of its series, where it has several (shared
    # devices under --kubernetes-virtual-gpus, HPC jobs, containers)
    copies: Mapping[str, tuple[str, ...]] | None
    xid_text: Mapping[int, str]  # XID code -> its description
    nobody: str  # -k: the empty pod labels of a device no container holds

    def labels(self, dev: Device) -> str:
        """The labels of a device's series: its own, plus its holder's when one holds it."""
        return self.series_labels[dev.key]

    def each(self, dev: Device) -> tuple[str, ...]:
        """The label text of each of a device's series: one per holder of a shared device
        under --kubernetes-virtual-gpus, per HPC job or container, else just :meth:`labels`."""
        got = self.copies.get(dev.key) if self.copies is not None else None
        return got or (self.series_labels[dev.key],)


def rows(
    series_labels: Mapping[str, str],
    targets: Targets,
    copies: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(device rows, instance rows) of this cycle's series devices, joined once per cycle;
    a device in ``copies`` (label text per holder) gets one row per copy."""
    copies = copies or {}

    def each(d: Device) -> tuple[str, ...]:
        return copies.get(d.key) or (series_labels[d.key],)

    dev = [(labels, key) for d, key in targets.device for labels in each(d)]
    inst = [(labels, d.key) for d in targets.instance for labels in each(d)]
    return dev, inst


def _scope(spec: MetricSpec, device: columns.Rows, instance: columns.Rows) -> columns.Rows:
    return device if spec.field.scope is Scope.DEVICE else instance


# kept across cycles by the caller of :func:`render`
Reuse = columns.Reuse


def per_process(spec: MetricSpec, fr: View) -> list[str]:
    """GPU_UTIL and FB_USED under --kubernetes-virtual-gpus (without it they are plain
    values): a shared device keeps its series without pod labels and adds one per holder,
    valued from that holder's processes (dcgm-exporter's per-process split). Their DCGM
    4.7 names (GPU_UTIL_RATIO, FB_USED_BYTES) split the same shares, in their own unit."""
    v = fr.virtual
    assert v is not None  # render writes these families as plain values without copies
    r = by_new().get(spec.field.name)
    shares = v.shares.get(r.old if r else spec.field.name, {})
    # the shares are in the old name's unit, as is DCGM 4.6's reading of a 4.7 name (DCGM46)
    unit = r.scale if r and spec.field is not DCGM46.get(r.new) else 1.0
    if spec.field.scope is Scope.DEVICE:
        series: Sequence[tuple[Device, str]] = fr.targets.device
    else:
        series = [(d, d.key) for d in fr.targets.instance]
    name, num, field = spec.name, text.num, spec.field.name
    out = []
    for dev, key in series:
        got = fr.snap.values.get(key)
        value = got.get(field) if got is not None else None
        if value is None:
            continue
        out.append(f"{name}{{{fr.series_labels[dev.key]}}} {num(value)}\n")
        out.extend(f"{name}{{{labels}}} {num(x * unit)}\n" for labels, x in shares.get(dev.key, ()))
    return out


# Label text of the DCGM_EXP_* and XID families' own labels: a handful of values, joined
# once and reused every cycle (bounded: past the size the oldest are joined again).
@functools.lru_cache(maxsize=256)
def _xid_labels(x: int, description: str) -> str:
    return text.join((("err_code", str(x)), ("err_msg", description)))


@functools.lru_cache(maxsize=1024)
def _pair_labels(label: str, value: str, window: str) -> str:
    return f"{text.join(((label, value),))},{window}"


@functools.lru_cache(maxsize=256)
def _health_labels(s: HealthSeries, detail: bool) -> str:
    pairs = [("health_watch", s.watch), ("health_error_code", s.error_code)]
    if detail:
        pairs += [("health_error_severity", s.severity), ("health_error_category", s.category)]
    return text.join(pairs)


def last_xid(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_FI_DEV_XID_ERRORS: the last XID per GPU (0 for none), sticky like dcgm-exporter."""
    last = dict(fr.snap.xid.last)
    out: list[str] = []
    for dev, gpu in fr.targets.device:
        x = last.get(gpu, 0)
        more = _xid_labels(x, fr.xid_text[x])  # every last code and 0 are described
        out.extend(text.sample(spec.name, f"{w},{more}", str(x)) for w in fr.each(dev))
    return out


def xid_counts(spec: MetricSpec, fr: View) -> list[str]:
    """XID counts per device and code (and holder, with pod labels)."""
    out = []
    for s in fr.xids:
        where = fr.device_text(s.device)
        held = fr.holder_text(s.holder) if s.holder is not None else fr.nobody
        who = f"{held}," if held else ""
        out.append(text.sample(spec.name, f'{where},{who}xid="{s.xid}"', str(s.count)))
    return out


def xid(spec: MetricSpec, fr: View) -> list[str]:
    return last_xid(spec, fr) if spec.field.scope is Scope.DEVICE else xid_counts(spec, fr)


def _windowed(spec: MetricSpec, fr: View, counts: WindowCounts | None, label: str) -> list[str]:
    """A windowed count per series device: one line per label value, or one 0 without it."""
    if counts is None:
        return []
    by_gpu: dict[str, list[tuple[str | None, int]]] = {}
    for key, value, n in counts.series:
        by_gpu.setdefault(key, []).append((value, n))
    window = f'window_size_in_ms="{counts.window_ms}"'
    out: list[str] = []
    for dev, gpu in fr.targets.device:
        for value, n in by_gpu.get(gpu, ()):
            more = _pair_labels(label, value, window) if value is not None else window
            out.extend(text.sample(spec.name, f"{w},{more}", str(n)) for w in fr.each(dev))
    return out


def xid_window(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_EXP_XID_ERRORS_COUNT{xid, window_size_in_ms}: XIDs per GPU within the window."""
    return _windowed(spec, fr, fr.derived.xid_window, "xid")


def clock_events(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event, window_size_in_ms}: samples per active reason."""
    return _windowed(spec, fr, fr.derived.clock_window, "clock_event")


@functools.lru_cache(maxsize=64)
def _reason_label(name: str) -> str:
    return text.join((("clock_event", name),))


def clock_totals(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_EXP_CLOCK_EVENTS_TOTAL{clock_event}: per GPU, each reason's count once it occurred."""
    got = fr.derived.clock_totals or {}
    out: list[str] = []
    for dev, gpu in fr.targets.device:
        for name, n in got.get(gpu, ()):
            more = _reason_label(name)
            out.extend(text.sample(spec.name, f"{w},{more}", str(n)) for w in fr.each(dev))
    return out


def health(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_EXP_GPU_HEALTH_STATUS{health_watch, health_error_code}: 0 pass, 10 warn, 20 fail;
    with ``health_detail``, the code's severity and category too."""
    got = fr.derived.health
    out = []
    where = [(w, gpu) for dev, gpu in fr.targets.device for w in fr.each(dev)]
    where += [(w, d.key) for d in fr.targets.down for w in fr.each(d)]
    for labels, gpu in where:
        for s in got.get(gpu, ()):
            more = _health_labels(s, fr.health_detail)
            out.append(text.sample(spec.name, f"{labels},{more}", str(s.value)))
    return out


def p2p(spec: MetricSpec, fr: View) -> list[str]:
    """DCGM_EXP_P2P_STATUS{peer_gpu, link_status}: NVML's P2P status code per GPU and peer."""
    got = fr.snap.p2p
    out: list[str] = []
    for dev, gpu in fr.targets.device:
        for s in got.get(gpu, ()):
            more = text.join((("peer_gpu", str(s.peer_gpu)), ("link_status", s.link_status)))
            out.extend(text.sample(spec.name, f"{w},{more}", str(s.value)) for w in fr.each(dev))
    return out


SPECIAL: dict[Source, Callable[[MetricSpec, View], list[str]]] = {Source.XID: xid, Source.P2P: p2p}
BY_NAME: dict[str, Callable[[MetricSpec, View], list[str]]] = {
    "DCGM_EXP_XID_ERRORS_COUNT": xid_window,
    "DCGM_EXP_CLOCK_EVENTS_COUNT": clock_events,
    "DCGM_EXP_GPU_HEALTH_STATUS": health,
    "DCGM_EXP_CLOCK_EVENTS_TOTAL": clock_totals,
    "DCGM_FI_DEV_GPU_UTIL": per_process,
    "DCGM_FI_DEV_FB_USED": per_process,
    "DCGM_FI_DEV_GPU_UTIL_RATIO": per_process,
    "DCGM_FI_DEV_FB_USED_BYTES": per_process,
}


# What the DCGM_EXP_* families are written from, besides the series and their labels
_INPUTS: dict[str, Callable[[View], object]] = {
    "DCGM_EXP_XID_ERRORS_COUNT": lambda fr: fr.derived.xid_window,
    "DCGM_EXP_CLOCK_EVENTS_COUNT": lambda fr: fr.derived.clock_window,
    "DCGM_EXP_GPU_HEALTH_STATUS": lambda fr: fr.derived.health,
    "DCGM_EXP_CLOCK_EVENTS_TOTAL": lambda fr: fr.derived.clock_totals,
}


def _inputs(spec: MetricSpec, fr: View) -> tuple[object, ...] | None:
    """All that a family function's text depends on, or None for a family written every
    cycle (the XID counts, which name gone devices; per-holder copies of shared devices)."""
    if fr.virtual is not None or fr.copies is not None:
        return None
    got = _INPUTS.get(spec.field.name)
    if got is not None:
        data = got(fr)
    elif spec.field.source is Source.P2P:
        data = fr.snap.p2p
    elif spec.field.source is Source.XID and spec.field.scope is Scope.DEVICE:
        data = fr.snap.xid.last
    else:
        return None
    # the series devices and their label text: the same objects while the layout stays
    return (fr.targets, fr.series_labels, data)


def render(catalog: Catalog, fr: View, reuse: Reuse | None = None) -> tuple[list[bytes], int]:
    """Text (UTF-8) of every catalog family with samples this cycle, and the number of
    samples; ``reuse`` (kept across cycles) gives back unchanged plain-value families."""
    out: list[bytes] = []
    series = 0
    readings = fr.snap.values  # the rows of devices without readings left out
    joined = (columns.join(fr.device_rows, readings), columns.join(fr.instance_rows, readings))
    reuse = reuse or Reuse()
    reuse.start(*joined)
    for spec in catalog.metrics:
        offer()
        fn = BY_NAME.get(spec.field.name) or SPECIAL.get(spec.field.source)
        if fn is None or (fn is per_process and fr.virtual is None):
            body, n = reuse.family(spec, _scope(spec, *joined))
        elif (inputs := _inputs(spec, fr)) is not None:
            body, n = reuse.made(spec, inputs, functools.partial(fn, spec, fr))
        else:
            lines = fn(spec, fr)
            body = text.family(spec.name, spec.help, spec.type, lines).encode()
            n = len(lines)
        if n:
            out.append(body)
            series += n
    return out, series
