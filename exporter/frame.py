"""The frozen records that cross between the stages: workloads/ -> derive/ -> exposition.

A cycle is three stages, one direction: collect (NVML -> Snapshot), derive (the
snapshot and who holds each device -> :class:`Frame`, advancing the state that lives
across cycles) and render (Frame -> bytes). workloads/ hands over who holds what
(:class:`Held`; for GPU accounting each device's :class:`DeviceUse`), derive/ the values
with DCGM's semantics already resolved (health severity and category, XID
descriptions); the exposition reads only these, the Snapshot and the catalog, and
advances nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.nvml.devices import Device
from exporter.snapshot import Snapshot

# --- who holds what (workloads/) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """One container's hold on one device (whole GPU or MIG instance) in a cycle.

    ``share`` is its part of the device (0..1): 1 when it holds it alone; on a
    time-sliced or MPS device its replicas over the replicas advertised (else over
    those all its holders hold: :class:`DeviceUse`'s ``basis``). ``sm_percent`` is the SM
    utilization of its processes (percent of the whole GPU; shared whole GPUs whose
    processes were joined to pods, else None). ``running`` says whether it had a process
    on the device (None: not known).
    """

    namespace: str
    pod: str
    container: str
    share: float = 1.0
    sm_percent: float | None = None
    running: bool | None = None


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One device's holders in a cycle, and what ran on it that no holder accounts for.

    ``unaccounted_bytes`` and ``unaccounted_processes``: GPU memory (bytes) and number of
    processes that belong to no running container holding the device (a dead pod's
    leftovers, a process outside Kubernetes; every process of a device no one holds).
    ``unattributed_sm_percent``: SM utilization of processes on a shared whole GPU that
    could not be joined to one of its holders. ``replicas``: on a device held in replicas
    (time-slicing, MPS), how many the shares are over, with its ``basis``: "advertised"
    (the kubelet's GetAllocatableResources) or "held" (the replicas its holders hold,
    when the advertised ones are not known); 0 and "" on other devices.
    """

    claims: tuple[Claim, ...] = ()
    unaccounted_bytes: float = 0.0
    unaccounted_processes: int = 0
    unattributed_sm_percent: float = 0.0
    replicas: int = 0
    basis: str = ""


@dataclass(frozen=True, slots=True)
class Owner:
    """A container holding a device (through the device plugin or a DRA claim).

    A DRA claim's device is named by driver, pool and device name (the kubelet's
    answer); ``mig_profile`` and ``mig_uuid`` are set when the ResourceSlice calls the
    device a MIG device (``type: mig``), ``mig_uuid`` being the live instance's UUID."""

    namespace: str
    pod: str
    container: str
    claim: str = ""
    claim_namespace: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    mig_profile: str = ""
    mig_uuid: str = ""


@dataclass(frozen=True, slots=True)
class Unhealthy:
    """A container holding a device its DRA driver calls unhealthy: ``source`` "taint" (a
    NoSchedule or NoExecute taint on the ResourceSlice device; ``reason`` its key=value)
    or "pod_status" (KEP-4680's allocatedResourcesStatus; ``reason`` its health)."""

    owner: Owner
    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class Holder:
    """The one container holding a device, with its pod's UID and copied labels when enabled."""

    owner: Owner
    pod_uid: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # (label name, value), already sanitized
    vgpu: str = ""  # --kubernetes-virtual-gpus: its replica IDs of a shared device, comma-separated


@dataclass(frozen=True, slots=True)
class Split:
    """One shared device's framebuffer (MiB) and SM utilization (percent) per container."""

    device: Device
    fb: dict[Owner, float] = field(default_factory=dict)
    sm: dict[Owner, float] = field(default_factory=dict)  # empty on MIG instances


class Workloads(NamedTuple):
    """One cycle's HPC jobs (device key -> the IDs of the jobs using it) and containers
    (device key -> names of the containers holding it)."""

    jobs: Mapping[str, tuple[str, ...]]
    containers: Mapping[str, tuple[str, ...]]

    def __bool__(self) -> bool:
        return bool(self.jobs or self.containers)


@dataclass(frozen=True, slots=True)
class KubeStatus:
    """Attribution's state for the self-metrics."""

    kubelet_up: bool
    api_up: bool | None  # None when the API server is not watched
    unmatched: tuple[tuple[str, int], ...]  # (resource name, device IDs matching no device)
    attributed: int  # devices held by at least one container
    dropped: tuple[tuple[str, int], ...] = ()  # (input, items dropped at a bound or invalid)
    mapping_failures: int = 0  # cycles whose pod mapping failed (last good labels kept)


@dataclass(frozen=True, slots=True)
class Held:
    """Who holds the cycle's devices (all empty without pod attribution).

    ``holders``: device key -> the one container holding it (None without -k);
    ``splits``: per-container shares of devices several hold; ``sharers`` (only with
    --kubernetes-virtual-gpus): device key -> the containers holding it, when several;
    ``workloads``: HPC jobs and containers whose copies the series get; ``unhealthy``:
    device key -> the containers holding it while its DRA driver calls it unhealthy.
    """

    holders: Mapping[str, Holder] | None = None
    splits: tuple[Split, ...] = ()
    sharers: Mapping[str, tuple[Holder, ...]] | None = None
    workloads: Workloads | None = None
    unhealthy: Mapping[str, tuple[Unhealthy, ...]] = field(default_factory=dict)


# --- derived values (derive/) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """One exporter-made family's data: ``series`` = (device key, label value, count).

    The label value is the XID code or the clock-event name; None marks the one
    zero-valued series of a device with nothing in the window.
    """

    window_ms: int
    series: tuple[tuple[str, str | None, int], ...] = ()


class HealthSeries(NamedTuple):
    """One series: ``health_watch``, ``health_error_code`` and the result (0/10/20), with
    the code's severity and category from DCGM's table (``UNKNOWN``/``NONE`` when absent)."""

    watch: str
    error_code: str
    value: int
    severity: str = "UNKNOWN"
    category: str = "NONE"


Totals = dict[str, tuple[tuple[str, int], ...]]
"""GPU key -> (clock_event, count) per reason counted so far, in bit order."""


@dataclass(frozen=True, slots=True)
class XidSeries:
    """One counter series: where (last known device), which code, charged to whom, how many."""

    device: Device
    xid: int
    holder: Hashable | None  # the Holder charged, None without pod labels
    count: int


@dataclass(frozen=True, slots=True)
class Derived:
    """This cycle's data of the DCGM_EXP_* families, by physical GPU key (None: not enabled)."""

    xid_window: WindowCounts | None = None
    clock_window: WindowCounts | None = None
    health: Mapping[str, tuple[HealthSeries, ...]] = field(default_factory=dict)
    clock_totals: Totals | None = None


HolderKey = tuple[str, str, str, str]
"""(device key, namespace, pod, container); the names are "" for a device holding itself."""


class Window(NamedTuple):
    """When a holder began (``start``) and stopped (``end``) holding its device, unix
    seconds, where it happened since the last cycle (None: not in that time, or not
    known); ``share``: its part of the device (Claim.share) when last seen."""

    start: float | None
    end: float | None
    share: float = 1.0


class HolderAccount(NamedTuple):
    """One holder's totals on one device: GPU-seconds and joules. ``labels`` is the same
    tuple for as long as the ledger keeps the holder; ``ended_at`` (unix s) None while it
    holds. An ended holder's record is the same object every cycle (its values stay)."""

    key: HolderKey
    labels: tuple[tuple[str, str], ...]
    allocated: float
    busy: float
    idle: float
    energy: float
    ended_at: float | None
    activity_energy: float = 0.0  # J: idle power by allocation, power above it by activity


class GpuAccount(NamedTuple):
    """One physical GPU's parts no holder has: GPU-seconds and joules. ``unknown``:
    (reason, GPU-seconds, joules) of the time its holders were not known, by reason;
    ``down``: the time the exporter was not running and the energy used meanwhile (with
    a state directory; None without)."""

    key: str
    labels: tuple[tuple[str, str], ...]
    unallocated: float
    unattributed: float
    unknown: tuple[tuple[str, float, float], ...] = ()
    down: tuple[float, float] | None = None  # (GPU-seconds, joules) the exporter was down
    activity_unattributed: float = 0.0  # J no holder got by the activity split
    idle_watts: float | None = None  # the idle power the activity split used; None: not yet


class Unaccounted(NamedTuple):
    """A device's processes that belong to no running container holding it."""

    device: Device
    allocated: bool  # whether some container holds the device
    bytes: float  # their GPU memory
    processes: int


@dataclass(frozen=True, slots=True)
class Accounts:
    """GPU accounting's values after a cycle. ``unaccounted`` is None without pod
    attribution; ``dropped``: (reason, holders dropped) for "limit" and "retention";
    ``replicas``: (device, replicas its shares are over, basis) of each device held in
    replicas (DeviceUse); ``bases``: (device, what the energy split by activity measured
    its activity by: "gpm", "processes", "utilization" or "allocation")."""

    holders: tuple[HolderAccount, ...] = ()
    gpus: tuple[GpuAccount, ...] = ()
    unaccounted: tuple[Unaccounted, ...] | None = None
    dropped: tuple[tuple[str, int], ...] = ()
    replicas: tuple[tuple[Device, int, str], ...] = ()
    bases: tuple[tuple[Device, str], ...] = ()  # what each device's activity was measured by


@dataclass(frozen=True, slots=True)
class Frame:
    """One cycle as the exposition renders it: the snapshot, who held its devices, and the
    derived values. ``xid_text``: the description (``err_msg``) of each last-XID code of the
    snapshot, 0 included. ``accounts`` None before the first cycle has been derived."""

    snap: Snapshot
    held: Held = Held()
    xids: tuple[XidSeries, ...] = ()
    derived: Derived = Derived()
    accounts: Accounts | None = None
    xid_text: Mapping[int, str] = field(default_factory=dict)
