"""GPUs and MIG instances: enumeration, identity read once, and the label pairs each carries.

Enumeration runs every cycle because MIG layouts change at run time and GPUs
fall off the bus; it costs a handful of calls per device because identities
(UUID, name, bus id, label fields) are read once and reused while the handle
and UUID stay the same.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pynvml as N

from exporter.nvml.fields import Call, Field
from exporter.nvml.session import CallFailed, DeviceLost, DriverGone, Session, Unavailable

log = logging.getLogger(__name__)

_GAP = frozenset({N.NVML_ERROR_NOT_FOUND})
_MIG_MODE = Call("nvmlDeviceGetMigMode")
_MAX_MIG = Call("nvmlDeviceGetMaxMigDeviceCount")
_NO_PROFILE = frozenset({N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT})
FALLBACK_GPU_SLICES = 7  # A100, H100, H200, B200; used only when NVML lists no profile


@dataclass(frozen=True, slots=True, eq=False)
class Device:
    """A physical GPU, or a MIG instance of one, with the (name, value) label pairs of its series.

    ``key`` is the UUID that identifies it (``GPU-...`` or ``MIG-...``); MIG
    instances keep their parent's ``gpu`` index and ``UUID`` label, as
    dcgm-exporter does, and add ``GPU_I_PROFILE`` and ``GPU_I_ID`` (and ``GPU_CI_ID``
    when mimicking dcgm-exporter 4.8.4 or later).
    """

    key: str
    index: int
    uuid: str
    model: str
    handle: Any
    labels: tuple[tuple[str, str], ...]
    parent: Device | None = None
    gi: int | None = None
    ci: int | None = None
    profile: str = ""
    slices: int = 0  # MIG: compute slices of the instance (from its attributes, not its name)
    gpu_slices: int = 0  # MIG: compute slices of the whole GPU (its largest GPU instance profile)
    placement: int | None = None  # MIG: the GPU instance's first memory slice, None if unknown

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    @property
    def number(self) -> str:
        """The device as nvidia-smi numbers it: ``<gpu>``, or ``<gpu>.<gpu instance>`` for a
        MIG instance (the names of dcgm-exporter's HPC job files)."""
        return f"{self.index}.{self.gi}" if self.is_mig else str(self.index)


@dataclass(frozen=True, slots=True)
class Inventory:
    """What one enumeration found: physical GPUs, MIG instances, and GPUs that stopped answering."""

    gpus: tuple[Device, ...] = ()
    mig_enabled: frozenset[str] = frozenset()  # UUIDs of GPUs in MIG mode
    instances: tuple[Device, ...] = ()
    lost: tuple[Device, ...] = ()

    def entities(self) -> tuple[Device, ...]:
        """Devices that carry instance-level series: whole GPUs, and MIG instances."""
        whole = tuple(g for g in self.gpus if g.key not in self.mig_enabled)
        return whole + self.instances


def _addr(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Enumerator:
    """Finds devices each cycle, reusing identities read in earlier cycles."""

    def __init__(
        self,
        session: Session,
        hostname: str,
        hostname_label: str = "Hostname",
        label_fields: Iterable[Field] = (),
    ) -> None:
        self.session = session
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.label_fields = tuple(label_fields)
        self.replace_blanks = False  # modelName "NVIDIA H100" -> "NVIDIA-H100" (-rbmn)
        self.ci_label = False  # GPU_CI_ID after GPU_I_ID on MIG series (dcgm-exporter 4.8.4)
        self._known: dict[int, Device] = {}  # handle address -> GPU
        self._mig: dict[str, Device] = {}  # MIG UUID -> instance
        self._seen: dict[str, Device] = {}  # every GPU ever seen, by UUID
        self._mig_slots: dict[str, int] = {}  # GPU UUID -> nvmlDeviceGetMaxMigDeviceCount
        self._gpu_slices: dict[str, int] = {}  # GPU UUID -> compute slices of the whole GPU
        self._uuid_buf = ctypes.create_string_buffer(N.NVML_DEVICE_UUID_V2_BUFFER_SIZE)
        self._uuid_len = ctypes.c_uint(N.NVML_DEVICE_UUID_V2_BUFFER_SIZE)

    def set_label_fields(self, fields: Iterable[Field]) -> None:
        """Label fields to read from now on; identities are read again if they changed."""
        fields = tuple(fields)
        if fields != self.label_fields:
            self.label_fields = fields
            self.reset()

    def reset(self) -> None:
        """Forget handles (after NVML was re-initialised, old handles are invalid)."""
        self._known.clear()
        self._mig.clear()
        self._mig_slots.clear()
        self._gpu_slices.clear()

    def enumerate(self) -> Inventory:
        """One enumeration pass; raises :class:`DriverGone` if NVML is unusable."""
        count = self.session.run("nvmlDeviceGetCount")
        gpus: list[Device] = []
        mig_enabled: set[str] = set()
        instances: list[Device] = []
        for i in range(count):
            try:
                gpu = self._gpu(i)
            except (DeviceLost, CallFailed) as e:
                log.debug("GPU %d not answering: %s", i, e)
                continue
            gpus.append(gpu)
            try:
                mig = self._mig_instances(gpu)
            except (DeviceLost, CallFailed) as e:
                log.debug("GPU %d MIG enumeration failed: %s", i, e)
                mig = None
            if mig is not None:
                mig_enabled.add(gpu.key)
                instances.extend(mig)
        present = {g.key for g in gpus}
        lost = tuple(d for k, d in self._seen.items() if k not in present)
        self._prune_instances(instances)
        return Inventory(tuple(gpus), frozenset(mig_enabled), tuple(instances), lost)

    def _prune_instances(self, instances: list[Device]) -> None:
        """Forget MIG instances this pass did not find.

        Each new MIG layout brings new instance UUIDs; without this, every
        reconfiguration would leave its old instances here for good.
        """
        if len(self._mig) != len(instances):
            self._mig = {m.key: m for m in instances}

    def _gpu(self, index: int) -> Device:
        s = self.session
        handle = s.run("nvmlDeviceGetHandleByIndex", index)
        known = self._known.get(_addr(handle))
        if known is not None and known.index == index:
            return known
        uuid = _text(s.call(Call("nvmlDeviceGetUUID"), handle))
        name = _text(s.call(Call("nvmlDeviceGetName"), handle))
        bus = _text(s.call(Call("nvmlDeviceGetPciInfo_v3"), handle).busId)
        try:
            minor = s.call(Call("nvmlDeviceGetMinorNumber"), handle)
        except Unavailable:
            minor = index
        labels = [
            ("gpu", str(index)),
            ("UUID", uuid),
            ("pci_bus_id", bus),
            ("device", f"nvidia{minor}"),
            ("modelName", name.replace(" ", "-") if self.replace_blanks else name),
            *([(self.hostname_label, self.hostname)] if self.hostname_label else []),
            *self._label_values(handle, uuid),
        ]
        gpu = Device(uuid, index, uuid, name, handle, tuple(labels))
        self._known[_addr(handle)] = gpu
        self._seen[uuid] = gpu
        return gpu

    def _label_values(self, handle: Any, uuid: str) -> list[tuple[str, str]]:
        out = []
        for f in self.label_fields:
            assert f.call is not None
            try:
                raw = self.session.call(f.call, handle)
            except (Unavailable, CallFailed) as e:
                self.session.unsupported_field(f.name, uuid, str(e))
                continue
            out.append((f.name, _text(f.pick(raw) if f.pick else raw)))
        return out

    def _mig_instances(self, gpu: Device) -> list[Device] | None:
        """MIG instances of a GPU in MIG mode, or None when MIG is off or unsupported."""
        s = self.session
        try:
            current, _pending = s.call(_MIG_MODE, gpu.handle)
        except Unavailable:
            return None
        if current != N.NVML_DEVICE_MIG_ENABLE:
            return None
        limit = self._mig_slots.get(gpu.key)
        if limit is None:  # the board's number of MIG slots: asked once per GPU
            limit = s.call(_MAX_MIG, gpu.handle)
            if limit:
                self._mig_slots[gpu.key] = limit
        out = []
        for j in range(limit):
            # NVML leaves gaps in the MIG device index space (NOT_FOUND)
            handle = s.run("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, j, empty=_GAP)
            if handle is None:
                continue
            try:
                out.append(self._instance(gpu, handle))
            except Unavailable as e:
                log.debug("MIG device %d of GPU %d skipped: %s", j, gpu.index, e)
        return out

    def _mig_uuid(self, handle: Any) -> str:
        """A MIG device's UUID, asked every cycle: what pynvml's nvmlDeviceGetUUID passes,
        into a buffer kept for it (UUIDs are ASCII)."""
        self.session.c_call("nvmlDeviceGetUUID", handle, self._uuid_buf, self._uuid_len)
        return self._uuid_buf.value.decode()

    def _instance(self, gpu: Device, handle: Any) -> Device:
        s = self.session
        key = self._mig_uuid(handle)
        known = self._mig.get(key)
        if known is not None and known.parent is gpu:
            return known
        gi = s.call(Call("nvmlDeviceGetGpuInstanceId"), handle)
        ci = s.call(Call("nvmlDeviceGetComputeInstanceId"), handle)
        attrs = s.call(Call("nvmlDeviceGetAttributes_v2"), handle)
        profile = f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"
        # the compute instance's slices: several compute instances of one GPU instance
        # then add up to the GPU instance's, never more
        slices = attrs.computeInstanceSliceCount or attrs.gpuInstanceSliceCount
        base = list(gpu.labels)
        at = [k for k, _ in base].index("modelName") + 1
        mig = [("GPU_I_PROFILE", profile), ("GPU_I_ID", str(gi))]
        if self.ci_label:
            mig.append(("GPU_CI_ID", str(ci)))
        labels = [*base[:at], *mig, *base[at:]]
        dev = Device(
            key,
            gpu.index,
            gpu.uuid,
            gpu.model,
            handle,
            tuple(labels),
            gpu,
            gi,
            ci,
            profile,
            slices,
            self._slices_of(gpu),
            self._placement(gpu, gi),
        )
        self._mig[key] = dev
        return dev

    def _placement(self, gpu: Device, gi: int) -> int | None:
        """The first memory slice of GPU instance ``gi`` (NVML's placement start, which
        NVIDIA's DRA driver writes into a MIG device's name), asked once per instance."""
        try:
            handle = self.session.run("nvmlDeviceGetGpuInstanceById", gpu.handle, gi)
            return int(self.session.run("nvmlGpuInstanceGetInfo", handle).placement.start)
        except (Unavailable, CallFailed) as e:
            log.debug("GPU %d instance %d: no placement (%s)", gpu.index, gi, e)
            return None

    def _slices_of(self, gpu: Device) -> int:
        """Compute slices of a whole GPU: the most any GPU instance profile it supports has
        (7 on A100 and H100, 4 on A30), asked once per GPU."""
        got = self._gpu_slices.get(gpu.key)
        if got is not None:
            return got
        most = 0
        for profile in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.session.run(
                    "nvmlDeviceGetGpuInstanceProfileInfo", gpu.handle, profile, empty=_NO_PROFILE
                )
            except (Unavailable, CallFailed):
                break  # the driver lacks the call: no profile will answer
            if info is not None:
                most = max(most, int(info.sliceCount))
        if not most:
            log.info(
                "GPU %d: NVML lists no GPU instance profile; taking %d compute slices",
                gpu.index,
                FALLBACK_GPU_SLICES,
            )
            most = FALLBACK_GPU_SLICES
        self._gpu_slices[gpu.key] = most
        return most


__all__ = ["Device", "DriverGone", "Enumerator", "Inventory"]
