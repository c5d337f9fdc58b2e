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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.exposition import text
from exporter.nvml.devices import Device

Copies = Mapping[str, tuple[str, ...]]  # device key -> the label text of each of its series


def job_key(dev: Device) -> str:
    """The job file a device's series look up: ``<gpu>`` or ``<gpu>.<gpu instance>``."""
    return f"{dev.index}.{dev.gi}" if dev.is_mig else str(dev.index)


def copies(
    devices: Iterable[Device],
    series_labels: Mapping[str, str],
    base: Copies | None,
    jobs: Mapping[str, tuple[str, ...]],
    containers: Mapping[str, tuple[str, ...]],
) -> dict[str, tuple[str, ...]]:
    """Each device's series label text with the job and container copies applied.

    ``base``: copies already made (per holder of a shared device); ``jobs``: job file
    name -> job IDs; ``containers``: device key -> names of the containers holding it.
    Only devices that change are in the result, besides those of ``base``.
    """
    out: dict[str, tuple[str, ...]] = dict(base or {})
    done: set[str] = set()
    for d in devices:
        if d.key in done:  # a whole GPU is both a GPU and an entity of the snapshot
            continue
        done.add(d.key)
        held = containers.get(d.key)
        ids = jobs.get(job_key(d))
        if not held and not ids:
            continue
        labels = out.get(d.key) or (series_labels[d.key],)
        if held:
            labels = labels + tuple(
                f"{lab},{text.join((('container', name),))}" for lab in labels for name in held
            )
        if ids:
            labels = tuple(f"{lab},{text.join((('hpc_job', j),))}" for lab in labels for j in ids)
        out[d.key] = labels
    return out
