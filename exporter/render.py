"""Snapshot to Prometheus text exposition, with dcgm-exporter's names and labels.

Runs once per cycle in the poller; scrapes only serve the bytes it produced.
Label text of each device is pre-rendered when the device is enumerated, so
rendering is string joins over the snapshot's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from exporter.catalog import Catalog, MetricSpec
from exporter.nvml.devices import Device, escape
from exporter.nvml.fields import Scope, Source
from exporter.snapshot import Snapshot
from exporter.xidcount import Series, XidCounter
from exporter.xids import describe

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def _head(spec: MetricSpec) -> str:
    help_text = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {spec.name} {help_text}\n# TYPE {spec.name} {spec.type}\n"


def render(
    snap: Snapshot,
    catalog: Catalog,
    extra: Mapping[str, str] | None = None,
    xid_series: Iterable[Series] | None = None,
) -> tuple[str, int]:
    """Render the DCGM series of a snapshot; returns (text, number of series).

    ``extra`` maps a device key to more label text (``pod="..."``) for its series;
    ``xid_series`` are the XID counter's series (xidcount.py), by default one per
    device and code.
    """
    if xid_series is None:
        xid_series = XidCounter().update(snap)
    extra = extra or {}
    out: list[str] = []
    series = 0

    def labels(dev: Device, more: str = "") -> str:
        text = dev.text
        add = extra.get(dev.key)
        if add:
            text = f"{text},{add}"
        return f"{text},{more}" if more else text

    for spec in catalog.metrics:
        f = spec.field
        lines: list[str] = []
        if f.source is Source.XID:
            lines = _xid_lines(spec, snap, labels, xid_series)
        else:
            devices = snap.gpus if f.scope is Scope.DEVICE else snap.entities
            name = spec.name
            for dev in devices:
                v = snap.values.get(dev.key, {}).get(f.name)  # name: 1.x with -o
                if v is not None:
                    lines.append(f"{name}{{{labels(dev)}}} {_num(v)}\n")
        if lines:
            out.append(_head(spec))
            out.extend(lines)
            series += len(lines)
    return "".join(out), series


def _xid_lines(
    spec: MetricSpec, snap: Snapshot, labels: Callable[..., str], xid_series: Iterable[Series]
) -> list[str]:
    name = spec.name
    if spec.field.scope is Scope.DEVICE:  # last XID per GPU, sticky like dcgm-exporter
        last = dict(snap.xid.last)
        out = []
        for gpu in snap.gpus:
            x = last.get(gpu.uuid, 0)
            more = f'err_code="{x}",err_msg="{escape(describe(x))}"'
            out.append(f"{name}{{{labels(gpu, more)}}} {x}\n")
        return out
    out = []
    for dev, xid, owner, n in xid_series:
        more = f'{owner},xid="{xid}"' if owner else f'xid="{xid}"'
        out.append(f"{name}{{{dev.text},{more}}} {n}\n")
    return out
