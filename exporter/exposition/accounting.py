"""The accounting families: per-holder counters, each GPU's unallocated and unattributed
parts, unaccounted GPU memory, and the holders dropped.

Holder series carry the device's identity in our own families' snake_case (``gpu``,
``uuid``, ``model_name``, a MIG instance's ``gpu_i_profile`` and ``gpu_i_id``, the node
label as ``hostname``) and, with pod
attribution, ``pod``, ``namespace`` and ``container``: not the bus id, device file or
label fields, which say nothing accounting needs and would double the bytes. A
holder's lines are prefixed once, when it is first rendered; a cycle writes values.
The values come from derive/accounting/ (exporter.frame.Accounts).
Unaccounted memory is exported for the devices that have some (absent: none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.exposition import text
from exporter.frame import Accounts, GpuAccount, HolderAccount, HolderKey

ALLOCATED = "gpu_exporter_allocated_gpu_seconds_total"
BUSY = "gpu_exporter_busy_gpu_seconds_total"
IDLE = "gpu_exporter_idle_gpu_seconds_total"
ENERGY = "gpu_exporter_energy_joules_total"
UNALLOCATED = "gpu_exporter_unallocated_gpu_seconds_total"
UNATTRIBUTED = "gpu_exporter_unattributed_energy_joules_total"
UNACCOUNTED_BYTES = "gpu_exporter_unaccounted_memory_bytes"
UNACCOUNTED_PROCS = "gpu_exporter_unaccounted_processes"
DROPPED = "gpu_exporter_accounting_holders_dropped_total"
REPLICAS = "gpu_exporter_accounting_share_replicas"
UNKNOWN = "gpu_exporter_attribution_unknown_gpu_seconds_total"
DOWN = "gpu_exporter_down_gpu_seconds_total"
DOWN_ENERGY = "gpu_exporter_down_energy_joules_total"
UNKNOWN_ENERGY = "gpu_exporter_attribution_unknown_energy_joules_total"
ACTIVITY_ENERGY = "gpu_exporter_activity_energy_joules_total"
ACTIVITY_UNATTRIBUTED = "gpu_exporter_unattributed_activity_energy_joules_total"
IDLE_POWER = "gpu_exporter_idle_power_watts"
ACTIVITY_BASIS = "gpu_exporter_activity_basis"
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
    ACTIVITY_ENERGY: "The holder's part of its GPU's energy (J) by activity: the GPU's idle "
    "power by allocation, the power above it by measured activity "
    "(gpu_exporter_activity_basis).",
    ACTIVITY_UNATTRIBUTED: "Energy of the GPU (J) no holder was charged by the activity "
    "split: idle power of unallocated parts, activity of no holder.",
    IDLE_POWER: "The GPU's idle power (W) the activity split uses: the lowest average power "
    "of a collection interval since the exporter started.",
    ACTIVITY_BASIS: "1 for what a device's activity is measured by in the energy split by "
    "activity: gpm (SM or graphics-engine activity), processes (their SM utilization), "
    "utilization (no GPM), allocation (nothing measured).",
    UNKNOWN: "GPU-seconds of the GPU whose holders were not known (the kubelet not "
    "answering for longer than the exporter charges its last answer), by reason.",
    UNKNOWN_ENERGY: "Energy of the GPU (J) while its holders were not known, by reason.",
    DOWN: "GPU-seconds of the GPU while the exporter was not running (counted at a "
    "restart with --accounting-state-dir).",
    DOWN_ENERGY: "Energy of the GPU (J) while the exporter was not running.",
    UNACCOUNTED_BYTES: "GPU memory of processes that belong to no running container holding "
    "the device (a dead pod's leftovers, processes outside Kubernetes).",
    UNACCOUNTED_PROCS: "Processes that belong to no running container holding the device.",
    DROPPED: "Accounting holders whose series were dropped: their retention ended, or "
    "the bound on holders was reached.",
    REPLICAS: "Replicas a time-sliced or MPS device's shares are over: those advertised "
    '(basis="advertised", GetAllocatableResources), else those its holders hold '
    '(basis="held"); on a DRA device several claims hold, the claims its shares are over '
    '(basis="capacity": by consumed capacity; basis="even": equal parts, the capacity '
    "not known).",
}
COUNTERS = (ALLOCATED, BUSY, IDLE, ENERGY, ACTIVITY_ENERGY)
LEFT_OUT = frozenset({"pci_bus_id", "device"})  # and label fields (DCGM_FI_*)


def identity(labels: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The device label pairs accounting series keep, in snake_case (text.OWN_LABELS)."""
    return text.own_labels(labels, LEFT_OUT)


Labels = tuple[tuple[str, str], ...]
Lines = tuple[str, str, str, str, str]
HolderEntry = tuple[Labels, Lines, HolderAccount, Lines]  # labels, prefixes, record, lines
GpuEntry = tuple[Labels, tuple[str, str]]  # labels, prefixes


class AccountText:
    """The accounting families' text; each holder's and GPU's label text is joined once
    and kept by its key while the ledger keeps it (a record with other labels under the
    same key is joined again), and an ended holder's lines are written once."""

    def __init__(self) -> None:
        # holder key -> (its labels, "name{labels} " of the five counters, record, lines)
        self._holders: dict[HolderKey, HolderEntry] = {}
        self._gpus: dict[str, GpuEntry] = {}

    def _holder(self, acc: HolderAccount, last: Mapping[HolderKey, HolderEntry]) -> Lines:
        """The holder's five sample lines (``last``: the previous cycle's entries)."""
        got = last.get(acc.key)
        if got is not None and got[2] is acc:
            self._holders[acc.key] = got  # an ended holder: its values no longer change
            return got[3]
        if got is not None and (got[0] is acc.labels or got[0] == acc.labels):
            prefixes = got[1]
        else:
            _, namespace, pod, container = acc.key
            pairs = identity(acc.labels)
            if pod or namespace or container:
                pairs += [("pod", pod), ("namespace", namespace), ("container", container)]
            joined = text.join(pairs)
            a, b, i, e, x = (f"{name}{{{joined}}} " for name in COUNTERS)
            prefixes = (a, b, i, e, x)
        a, b, i, e, x = prefixes
        lines = (
            f"{a}{acc.allocated:.3f}\n",
            f"{b}{acc.busy:.3f}\n",
            f"{i}{acc.idle:.3f}\n",
            f"{e}{acc.energy:.3f}\n",
            f"{x}{acc.activity_energy:.3f}\n",
        )
        self._holders[acc.key] = (acc.labels, prefixes, acc, lines)
        return lines

    def _gpu(self, acc: GpuAccount, last: Mapping[str, GpuEntry]) -> tuple[str, str]:
        got = last.get(acc.key)
        if got is None or not (got[0] is acc.labels or got[0] == acc.labels):
            joined = text.join(identity(acc.labels))
            got = (acc.labels, (f"{UNALLOCATED}{{{joined}}} ", f"{UNATTRIBUTED}{{{joined}}} "))
        self._gpus[acc.key] = got
        return got[1]

    def families(self, accounts: Accounts) -> tuple[str, int]:
        """Text and series count of the accounting families (no unaccounted-memory families
        without pod attribution)."""
        lines: dict[str, list[str]] = {name: [] for name in HELP}
        allocated, busy, idle, energy, activity = (lines[name] for name in COUNTERS)
        last, self._holders = self._holders, {}  # keeps only the records of this cycle
        for acc in accounts.holders:
            got = self._holder(acc, last)
            allocated.append(got[0])
            busy.append(got[1])
            idle.append(got[2])
            energy.append(got[3])
            activity.append(got[4])
        last_gpus, self._gpus = self._gpus, {}
        for gpu in accounts.gpus:
            u, w = self._gpu(gpu, last_gpus)
            lines[UNALLOCATED].append(f"{u}{gpu.unallocated:.3f}\n")
            lines[UNATTRIBUTED].append(f"{w}{gpu.unattributed:.3f}\n")
            joined = text.join(identity(gpu.labels))
            rest = f"{ACTIVITY_UNATTRIBUTED}{{{joined}}} {gpu.activity_unattributed:.3f}\n"
            lines[ACTIVITY_UNATTRIBUTED].append(rest)
            if gpu.idle_watts is not None:
                lines[IDLE_POWER].append(f"{IDLE_POWER}{{{joined}}} {gpu.idle_watts:.3f}\n")
            if gpu.down is not None:
                lines[DOWN].append(f"{DOWN}{{{joined}}} {gpu.down[0]:.3f}\n")
                lines[DOWN_ENERGY].append(f"{DOWN_ENERGY}{{{joined}}} {gpu.down[1]:.3f}\n")
            for reason, seconds, joules in gpu.unknown:
                pairs = text.join([*identity(gpu.labels), ("reason", reason)])
                lines[UNKNOWN].append(f"{UNKNOWN}{{{pairs}}} {seconds:.3f}\n")
                lines[UNKNOWN_ENERGY].append(f"{UNKNOWN_ENERGY}{{{pairs}}} {joules:.3f}\n")
        for un in accounts.unaccounted or ():
            held = ("allocated", "true" if un.allocated else "false")
            labels = text.join([*identity(un.device.labels), held])
            lines[UNACCOUNTED_BYTES].append(f"{UNACCOUNTED_BYTES}{{{labels}}} {round(un.bytes)}\n")
            lines[UNACCOUNTED_PROCS].append(f"{UNACCOUNTED_PROCS}{{{labels}}} {un.processes}\n")
        for dev, n, basis in accounts.replicas:
            labels = text.join([*identity(dev.labels), ("basis", basis)])
            lines[REPLICAS].append(f"{REPLICAS}{{{labels}}} {n}\n")
        for dev, basis in accounts.bases:
            labels = text.join([*identity(dev.labels), ("basis", basis)])
            lines[ACTIVITY_BASIS].append(f"{ACTIVITY_BASIS}{{{labels}}} 1\n")
        for reason, n in accounts.dropped:
            lines[DROPPED].append(f'{DROPPED}{{reason="{reason}"}} {n}\n')
        out = []
        n = 0
        for name, ls in lines.items():
            kind = "counter" if name in COUNTERS or name.endswith("_total") else "gauge"
            out.append(text.family(name, HELP[name], kind, ls))
            n += len(ls)
        return "".join(out), n
