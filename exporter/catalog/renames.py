"""The names dcgm-exporter 4.9 and 4.10 serve in place of older ones, and their units.

One table, ``exporter/catalog/dcgm-names.csv``, says for each renamed field its old and new
name, the unit of each, and the factor between them (new value = old value x factor).
:mod:`exporter.nvml.fields` builds the new fields from it, the rule and dashboard
generators write queries that answer under either name, and the tests hold
docs/compatibility.md to it. Only the standard library is imported here, so that the
generators can read the table without the exporter's dependencies.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass
from functools import cache
from math import gcd
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fractions import Fraction

F = TypeVar("F", bound=Any)

TABLE = Path(__file__).resolve().with_name("dcgm-names.csv")
STATUSES = ("confirmed", "unconfirmed")


@dataclass(frozen=True, slots=True)
class Rename:
    """One row: ``new`` (since ``since``) serves ``old``'s reading in ``unit``, times ``factor``."""

    old: str
    new: str
    old_unit: str
    unit: str
    num: int  # the factor, exactly: num / den (the exporter needs no fractions module)
    den: int
    confirmed: bool
    since: str = "4.9"  # the dcgm-exporter release that renames it

    @property
    def is_label(self) -> bool:
        return self.unit == "label"

    @property
    def scale(self) -> float:
        """The factor as a float."""
        return self.num / self.den

    @property
    def factor(self) -> Fraction:
        """The factor, exact (for the rules and dashboards generators)."""
        from fractions import Fraction

        return Fraction(self.num, self.den)


def _ratio(text: str, where: str) -> tuple[int, int]:
    """A decimal such as ``"1048576"`` or ``"0.001"`` as a reduced (numerator, denominator)."""
    whole, _, decimals = text.partition(".")
    try:
        num, den = int(whole + decimals), 10 ** len(decimals)
    except ValueError:
        raise ValueError(f"{where}: factor {text!r} is not a number") from None
    if num <= 0 or den <= 0:
        raise ValueError(f"{where}: factor {text!r} must be above 0")
    g = gcd(num, den)
    return num // g, den // g


def parse(text: str, source: str = str(TABLE)) -> tuple[Rename, ...]:
    """The rows of a renames table; ValueError naming the line on a malformed one."""
    out = []
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    header = True
    for row in rows:
        if not row or row[0].startswith("#"):
            continue
        if header:  # the first row names the columns
            header = False
            continue
        cells = [c.strip() for c in row]
        if len(cells) != 7 or cells[5] not in STATUSES:
            raise ValueError(
                f"{source}:{rows.line_num}: expected 7 columns: a status, then a release"
            )
        old, new, old_unit, unit, factor, status, since = cells
        num, den = _ratio(factor, f"{source}:{rows.line_num}")
        out.append(Rename(old, new, old_unit, unit, num, den, status == "confirmed", since))
    return tuple(out)


@cache
def renames() -> tuple[Rename, ...]:
    """The shipped table, in its order."""
    return parse(TABLE.read_text(encoding="utf-8"))


@cache
def by_new() -> dict[str, Rename]:
    """DCGM 4.7 name -> its row."""
    return {r.new: r for r in renames()}


@cache
def by_old() -> dict[str, Rename]:
    """Old name -> its row."""
    return {r.old: r for r in renames()}


def renamed(old: F, r: Rename) -> F:
    """A field (exporter.nvml.fields.Field) reading what ``old`` reads, under ``r.new``,
    converted to ``r.unit``: a rate's divisor or the scale takes the factor."""
    if r.is_label:
        return dataclasses.replace(old, name=r.new)
    factor = r.scale
    if old.rate:  # a rate divides the counter's change per second by ``rate``
        return dataclasses.replace(old, name=r.new, rate=old.rate / factor)
    integer = old.integer and r.den == 1
    scale = old.scale * factor
    return dataclasses.replace(old, name=r.new, scale=scale, integer=integer)
