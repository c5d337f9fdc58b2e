"""Copies of a device's series per HPC job and per container, as dcgm-exporter makes them.

- ``--hpc-job-mapping-dir``: a GPU (or MIG instance) with a job file has each of its
  series replaced by one copy per job, labelled ``hpc_job="<id>"``; a device without
  a file keeps its plain series. A whole GPU's series look up the file named by its
  index (``0``), a MIG instance's series the file ``<gpu>.<gpu instance>`` (``2.0``).
- ``--container-labels``: each series of a device a container holds is copied once
  per container with ``container="<name>"``; the series without it is kept.

Both apply to the label text of every series a device has (the text of a shared
device's per-holder copies under --kubernetes-virtual-gpus included); this module only
builds that text, once per cycle.

Containers and jobs multiply each other and every series of a device: the copies made
here are bounded by :data:`MAX_COPIES` label sets in all. Over it, each device with
copies keeps an equal share (at least one label set, the first in container and job
order), and the label sets left out are returned per device, to be counted and named.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

from exporter.exposition import text
from exporter.nvml.devices import Device

Copies = Mapping[str, tuple[str, ...]]  # device key -> the label text of each of its series

MAX_COPIES = 256
"""Label sets the job and container copies of all devices may have in one cycle; each
is one series per field of its device (about 100 with the default metrics file)."""


def copies(
    devices: Iterable[Device],
    series_labels: Mapping[str, str],
    base: Copies | None,
    jobs: Mapping[str, tuple[str, ...]],
    containers: Mapping[str, tuple[str, ...]],
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Each device's series label text with the job and container copies applied, and
    the label sets left out at :data:`MAX_COPIES` per device key.

    ``base``: copies already made (per holder of a shared device); ``jobs``: device key
    -> the IDs of the jobs using it; ``containers``: device key -> names of the containers
    holding it.
    Only devices that change are in the result, besides those of ``base``.
    """
    out: dict[str, tuple[str, ...]] = dict(base or {})
    wanted: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}
    for d in devices:
        if d.key in wanted:  # a whole GPU is both a GPU and an entity of the snapshot
            continue
        held = containers.get(d.key, ())
        ids = jobs.get(d.key, ())
        if held or ids:
            wanted[d.key] = (out.get(d.key) or (series_labels[d.key],), held, ids)
    sizes = {k: len(lab) * (1 + len(held)) * max(1, len(ids)) for k, (lab, held, ids) in
             wanted.items()}  # fmt: skip
    share = MAX_COPIES if sum(sizes.values()) <= MAX_COPIES else MAX_COPIES // len(sizes)
    dropped: dict[str, int] = {}
    for key, (labels, held, ids) in wanted.items():
        keep = max(1, share)
        out[key] = tuple(itertools.islice(_labels(labels, held, ids), keep))
        if sizes[key] > keep:
            dropped[key] = sizes[key] - keep
    return out, dropped


def _labels(labels: tuple[str, ...], held: tuple[str, ...], ids: tuple[str, ...]) -> Iterator[str]:
    """The label sets of a device's series, in dcgm-exporter's order: ``labels``, then
    each one's copy per container; with jobs, each of these once per job instead."""
    each = itertools.chain(
        labels, (f"{lab},{text.join((('container', n),))}" for lab in labels for n in held)
    )
    if not ids:
        yield from each
        return
    for lab in each:
        for j in ids:
            yield f"{lab},{text.join((('hpc_job', j),))}"
