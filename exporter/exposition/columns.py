"""Plain-value families: a cycle's readings per series, and family text kept across cycles.

The series of one scope repeat readings: under MIG each instance carries its GPU's
device-level values, so 56 device-level series of an 8-GPU node read 8 devices. A
family's readings are looked up, compared and formatted once per device, then written
once per series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.catalog.metricsfile import MetricSpec
from exporter.exposition import text
from exporter.snapshot import Value

Readings = Mapping[str, Value]  # one device's readings, by DCGM field name


@dataclass(frozen=True, slots=True)
class Rows:
    """The series of one scope that have readings this cycle."""

    labels: list[str]  # label text of each series
    index: list[int]  # per series, where its device's readings are in ``readings``
    readings: list[Readings]  # each device's readings, once, in order of first series

    def column(self, field: str) -> list[Value | None]:
        """Each device's reading of ``field`` (None: not read there)."""
        return [got.get(field) for got in self.readings]


def join(rows: Sequence[tuple[str, str]], readings: Mapping[str, Readings]) -> Rows:
    """Rows of (label text, key of the values) with the cycle's readings; the rows of
    devices without readings are left out."""
    labels: list[str] = []
    index: list[int] = []
    got: list[Readings] = []
    where: dict[str, int] = {}  # key -> position in ``got``, -1: no readings
    for lab, key in rows:
        i = where.get(key)
        if i is None:
            mine = readings.get(key)
            i = where[key] = -1 if mine is None else len(got)
            if mine is not None:
                got.append(mine)
        if i >= 0:
            labels.append(lab)
            index.append(i)
    return Rows(labels, index, got)


def lines(prefix: str, rows: Rows, column: Sequence[Value | None]) -> list[str]:
    """One sample line per series whose device has a reading; ``prefix``: ``name{``."""
    num = text.num
    # repr is what text.num writes for floats and ints
    texts = [
        None if v is None else repr(v) if (t := type(v)) is float or t is int else num(v)
        for v in column
    ]
    return [
        f"{prefix}{labels}}} {v}\n"
        for labels, i in zip(rows.labels, rows.index, strict=True)
        if (v := texts[i]) is not None
    ]


def _float_zero_signs(column: Sequence[Value | None]) -> list[float]:
    """The sign of each float zero: 0.0 and -0.0 compare equal but are written apart."""
    return [math.copysign(1.0, v) for v in column if type(v) is float and v == 0]


@dataclass(frozen=True, slots=True)
class _Kept:
    """A family as written last cycle, and the readings it was written from."""

    spec: MetricSpec
    column: list[Value | None]  # the reading per device
    kinds: list[type]  # the type of each
    signs: list[float] | None  # the sign of each float zero (None: no float zero)
    body: bytes  # UTF-8, as served
    samples: int


class Reuse:
    """Family text kept from the last cycle: a plain-value family whose series and
    readings are all as they were is not formatted again (counters, clocks, totals rarely
    move). Readings count as the same when equal, of the same type and, for a float zero,
    of the same sign: then their text is the same. A NaN never equals the last one, so
    its family is written again. Holds one entry per family of the catalog, all dropped
    whenever the series change."""

    def __init__(self) -> None:
        self._series: tuple[tuple[list[str], list[int]], ...] = ()
        self._families: dict[str, _Kept] = {}
        # family name -> (its spec, what it was made of, text, samples)
        self._made: dict[str, tuple[MetricSpec, tuple[object, ...], bytes, int]] = {}

    def start(self, *scopes: Rows) -> None:
        """Begin a cycle: forget every family if its series are not the last cycle's."""
        series = tuple((r.labels, r.index) for r in scopes)
        if series != self._series:  # the same label strings: compared by identity first
            self._series = series
            self._families.clear()
            self._made.clear()

    def family(self, spec: MetricSpec, rows: Rows) -> tuple[bytes, int]:
        """The text of a plain-value family over ``rows`` (UTF-8) and its number of samples."""
        column = rows.column(spec.field.name)  # by DCGM field (``name`` is 1.x's with -o)
        kinds = list(map(type, column))
        last = self._families.get(spec.name)
        if (
            last is not None
            and last.spec is spec
            and last.column == column
            and last.kinds == kinds
            and (last.signs is None or last.signs == _float_zero_signs(column))
        ):
            return last.body, last.samples
        got = lines(spec.name + "{", rows, column)
        body = text.family(spec.name, spec.help, spec.type, got).encode()
        signs = _float_zero_signs(column) if float in kinds and 0 in column else None
        self._families[spec.name] = _Kept(spec, column, kinds, signs, body, len(got))
        return body, len(got)

    def made(
        self, spec: MetricSpec, inputs: tuple[object, ...], make: Callable[[], list[str]]
    ) -> tuple[bytes, int]:
        """The text of a family that ``make`` writes from ``inputs`` alone (which hold no
        floats, so that equal inputs are written alike), and its number of samples:
        written again only when ``inputs`` differ from the last cycle's."""
        last = self._made.get(spec.name)
        if last is not None and last[0] is spec and last[1] == inputs:
            return last[2], last[3]
        lines = make()
        body = text.family(spec.name, spec.help, spec.type, lines).encode()
        self._made[spec.name] = (spec, inputs, body, len(lines))
        return body, len(lines)
