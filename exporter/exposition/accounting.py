"""The accounting families: per-holder counters, each GPU's unallocated and unattributed
parts, unaccounted GPU memory, and the holders dropped.

Holder series carry the device's identity in our own families' snake_case (``gpu``,
``uuid``, ``model_name``, a MIG instance's ``gpu_i_profile`` and ``gpu_i_id``, the node
label as ``hostname``) and, with pod
attribution, ``pod``, ``namespace`` and ``container``: not the bus id, device file or
label fields, which say nothing accounting needs and would double the bytes. A
holder's lines are prefixed once, when it is first rendered; a cycle writes values.
Unaccounted memory is exported for the devices that have some (absent: none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.derive.accounting.claims import DeviceUse
from exporter.derive.accounting.ledger import GpuAccount, HolderAccount, Ledger
from exporter.exposition import text
from exporter.nvml.devices import Device

ALLOCATED = "gpu_exporter_allocated_gpu_seconds_total"
BUSY = "gpu_exporter_busy_gpu_seconds_total"
IDLE = "gpu_exporter_idle_gpu_seconds_total"
ENERGY = "gpu_exporter_energy_joules_total"
UNALLOCATED = "gpu_exporter_unallocated_gpu_seconds_total"
UNATTRIBUTED = "gpu_exporter_unattributed_energy_joules_total"
UNACCOUNTED_BYTES = "gpu_exporter_unaccounted_memory_bytes"
UNACCOUNTED_PROCS = "gpu_exporter_unaccounted_processes"
DROPPED = "gpu_exporter_accounting_holders_dropped_total"
HELP = {
    ALLOCATED: "GPU-seconds held: a whole GPU counts 1 a second, a MIG instance its compute "
    "slices over the GPU's, a share of a time-sliced or MPS GPU its part.",
    BUSY: "Held GPU-seconds weighted by measured activity (utilization, SM activity).",
    IDLE: "Held GPU-seconds while the holder ran no process on the device or its activity "
    "was below --accounting-idle-threshold.",
    ENERGY: "The holder's part of its GPU's energy (J): by allocation on MIG, by measured "
    "SM share on a shared GPU.",
    UNALLOCATED: "GPU-seconds of the GPU that no one held.",
    UNATTRIBUTED: "Energy of the GPU (J) no holder was charged: idle power of unallocated "
    "parts, shares of processes that belong to no holder.",
    UNACCOUNTED_BYTES: "GPU memory of processes that belong to no running container holding "
    "the device (a dead pod's leftovers, processes outside Kubernetes).",
    UNACCOUNTED_PROCS: "Processes that belong to no running container holding the device.",
    DROPPED: "Accounting holders whose series were dropped: their retention ended, or "
    "the bound on holders was reached.",
}
COUNTERS = (ALLOCATED, BUSY, IDLE, ENERGY)
LEFT_OUT = frozenset({"pci_bus_id", "device"})  # and label fields (DCGM_FI_*)


def identity(labels: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The device label pairs accounting series keep, in snake_case (text.OWN_LABELS)."""
    return text.own_labels(labels, LEFT_OUT)


def _holder_lines(acc: HolderAccount) -> tuple[str, ...]:
    """``name{labels} `` of the holder's four counters, joined once."""
    if not acc.text:
        _, namespace, pod, container = acc.key
        pairs = identity(acc.device_labels)
        if pod or namespace or container:
            pairs += [("pod", pod), ("namespace", namespace), ("container", container)]
        acc.text = text.join(pairs)
        acc.prefixes = tuple(f"{name}{{{acc.text}}} " for name in COUNTERS)
    return acc.prefixes


def _samples(acc: HolderAccount) -> tuple[str, str, str, str]:
    """The holder's four sample lines."""
    a, b, i, e = _holder_lines(acc)
    return (
        f"{a}{acc.allocated:.3f}\n",
        f"{b}{acc.busy:.3f}\n",
        f"{i}{acc.idle:.3f}\n",
        f"{e}{acc.energy:.3f}\n",
    )


def _gpu_lines(acc: GpuAccount) -> tuple[str, ...]:
    if not acc.text:
        acc.text = text.join(identity(acc.labels))
        acc.prefixes = tuple(f"{name}{{{acc.text}}} " for name in (UNALLOCATED, UNATTRIBUTED))
    return acc.prefixes


def families(
    ledger: Ledger, uses: Mapping[str, DeviceUse] | None, devices: Iterable[Device]
) -> tuple[str, int]:
    """Text and series count of the accounting families. ``uses`` None (no pod
    attribution): no unaccounted-memory families."""
    lines: dict[str, list[str]] = {name: [] for name in HELP}
    allocated, busy, idle, energy = (lines[name] for name in COUNTERS)
    for acc in ledger.holders.values():
        got = acc.final or _samples(acc)
        if acc.ended_at is not None:
            acc.final = got  # an ended holder's values no longer change
        allocated.append(got[0])
        busy.append(got[1])
        idle.append(got[2])
        energy.append(got[3])
    for gpu in ledger.gpus.values():
        u, w = _gpu_lines(gpu)
        lines[UNALLOCATED].append(f"{u}{gpu.unallocated:.3f}\n")
        lines[UNATTRIBUTED].append(f"{w}{gpu.unattributed:.3f}\n")
    if uses is not None:
        for dev in devices:
            use = uses.get(dev.key)
            if use is None or not use.unaccounted_processes:
                continue
            held = ("allocated", "true" if use.claims else "false")
            labels = text.join([*identity(dev.labels), held])
            lines[UNACCOUNTED_BYTES].append(
                f"{UNACCOUNTED_BYTES}{{{labels}}} {round(use.unaccounted_bytes)}\n"
            )
            lines[UNACCOUNTED_PROCS].append(
                f"{UNACCOUNTED_PROCS}{{{labels}}} {use.unaccounted_processes}\n"
            )
    for reason in ("limit", "retention"):
        lines[DROPPED].append(f'{DROPPED}{{reason="{reason}"}} {ledger.dropped[reason]}\n')
    out = []
    n = 0
    for name, ls in lines.items():
        kind = "counter" if name in COUNTERS or name.endswith("_total") else "gauge"
        out.append(text.family(name, HELP[name], kind, ls))
        n += len(ls)
    return "".join(out), n
