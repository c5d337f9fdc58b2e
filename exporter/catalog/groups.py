"""Collections read at their own interval: the config file's patterns matched to fields.

A collection's glob patterns match the rows of the metrics file by their name as
written (``DCGM_FI_DEV_GPU_TEMP``, or ``dcgm_gpu_temp`` in a 1.x file) or by their
DCGM field name. Each pattern must match a row, and a field belongs to at most one
collection; the fields no collection takes are read every collect interval.

Only fields the cycle reads from NVML (batch fields, calls, GPM) change pace: label
fields are read when a device is enumerated, the XID thread reports as XIDs happen,
and the DCGM_EXP_* families are computed from the values at each collect interval.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.catalog.metricsfile import Catalog
from exporter.config.model import Collection
from exporter.nvml.fields import Field, Source, with_inputs

READ = (Source.FIELD, Source.CALL, Source.GPM)  # what a cycle reads field by field


class GroupError(ValueError):
    """A collection that cannot be used with this metrics file (one line)."""


@dataclass(frozen=True, slots=True)
class Group:
    """One collection resolved: the fields it reads, every ``interval_s`` seconds."""

    name: str
    interval_s: float
    fields: tuple[Field, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)


def resolve(catalog: Catalog, collections: Sequence[Collection]) -> tuple[Group, ...]:
    """The groups of ``collections`` over ``catalog``; raises GroupError."""
    rows: list[tuple[str, str, Field | None]] = [
        (m.name, m.field.name, m.field) for m in catalog.metrics + catalog.labels
    ]
    rows += [(s.name, s.name, None) for s in catalog.skipped]
    owner: dict[str, str] = {}
    groups = []
    for c in collections:
        picked: dict[str, Field] = {}
        for pat in c.patterns:
            hits = [
                r for r in rows if fnmatch.fnmatchcase(r[0], pat) or fnmatch.fnmatchcase(r[1], pat)
            ]
            if not hits:
                raise GroupError(
                    f"{c.where}: {pat[:80]!r} matches no row of {catalog.path}; "
                    "give a field name (or glob) of the metrics file"
                )
            for _, name, fld in hits:
                if owner.setdefault(name, c.name) != c.name:
                    raise GroupError(
                        f"{c.where}: {name} is also in collection {owner[name]!r}; "
                        "a field belongs to one collection"
                    )
                if fld is not None and fld.source in READ:
                    picked[fld.name] = fld
        groups.append(Group(c.name, c.interval_s, tuple(picked.values())))
    return tuple(groups)


def default_fields(catalog: Catalog, groups: Iterable[Group]) -> list[Field]:
    """What the collect-interval cycle reads: every field and input no group reads."""
    taken = frozenset().union(*(g.names for g in groups))
    return [f for f in with_inputs(m.field for m in catalog.metrics) if f.name not in taken]
