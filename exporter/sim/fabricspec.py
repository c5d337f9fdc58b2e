"""A GPU's NVLink fabric as nvmlDeviceGetGpuFabricInfoV reports it, and how fleet files set it.

A fleet's ``fabric:`` mapping (node-wide, and per GPU on top of it) and a ``fabric``
fault's mapping take the same keys; each is parsed into a partial change, applied over
the defaults (or, for a fault, over the GPU's fabric at the time)::

    state: completed          # not_started | in_progress | completed | not_supported
    status: SUCCESS           # the nvmlReturn the probe finished with (NVML's name)
    clique_id: 32766
    cluster_uuid: 8d6f...     # a UUID; default zeros
    health:                   # each left out is NOT_SUPPORTED in the health mask
      degraded_bw: false      # true / false, as the four below
      route_recovery: false
      route_unhealthy: false
      access_timeout_recovery: false
      incorrect_configuration: none   # none, incorrect_sysguid, ..., gpu_state_invalid
      partition_assigned: true
      gfm: connected          # connected | disconnected (global fabric manager)
    summary: healthy          # healthy | unhealthy | limited_capacity | not_supported

Field values and bit positions are nvml.h's (NVML_GPU_FABRIC_*). The summary is not
derived by NVML from documented rules; without ``summary`` the simulator takes
``unhealthy`` when a route is unhealthy, the configuration is wrong or the global
fabric manager is disconnected, ``limited_capacity`` when bandwidth is degraded, else
``healthy``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.sim.schema import Reader, join

STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
SUMMARIES = {"not_supported": 0, "healthy": 1, "unhealthy": 2, "limited_capacity": 3}
# health key -> (bit shift, value names in nvml.h order from 1)
HEALTH: dict[str, tuple[int, tuple[str, ...]]] = {
    "degraded_bw": (0, ("true", "false")),
    "route_recovery": (2, ("true", "false")),
    "route_unhealthy": (4, ("true", "false")),
    "access_timeout_recovery": (6, ("true", "false")),
    "incorrect_configuration": (
        8,
        (
            "none",
            "incorrect_sysguid",
            "incorrect_chassis_sn",
            "no_partition",
            "insufficient_nvlinks",
            "incompatible_gpu_fw",
            "invalid_location",
            "gpu_state_invalid",
        ),
    ),
    "partition_assigned": (12, ("true", "false")),
    "gfm": (14, ("connected", "disconnected")),
}
# What a fabric-capable GPU of a fleet without `fabric:` reports: registered, healthy.
DEFAULT_HEALTH = {
    "degraded_bw": "false",
    "route_recovery": "false",
    "route_unhealthy": "false",
    "access_timeout_recovery": "false",
    "incorrect_configuration": "none",
}
_KEYS = ("state", "status", "clique_id", "cluster_uuid", "health", "summary")


@dataclass(frozen=True)
class FabricSpec:
    """The fabric information one GPU reports; ``health`` maps HEALTH keys to value names."""

    state: str = "completed"
    status: str = "SUCCESS"
    clique_id: int = 0
    cluster_uuid: str = "00000000-0000-0000-0000-000000000000"
    health: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_HEALTH))
    summary: str | None = None  # None: derived from health

    @property
    def state_code(self) -> int:
        return STATES[self.state]

    @property
    def status_code(self) -> int:
        return status_code(self.status)

    @property
    def uuid_bytes(self) -> bytes:
        return uuid.UUID(self.cluster_uuid).bytes

    @property
    def health_mask(self) -> int:
        """NVML's health mask: each condition's value (1 + its index) at its bit shift."""
        mask = 0
        for key, value in self.health.items():
            shift, names = HEALTH[key]
            mask |= (names.index(value) + 1) << shift
        return mask

    @property
    def summary_code(self) -> int:
        return SUMMARIES[self.summary or self._derived_summary()]

    def _derived_summary(self) -> str:
        h = self.health
        if (
            h.get("route_unhealthy") == "true"
            or h.get("incorrect_configuration", "none") != "none"
            or h.get("gfm") == "disconnected"
        ):
            return "unhealthy"
        if h.get("degraded_bw") == "true":
            return "limited_capacity"
        return "healthy"


@dataclass(frozen=True)
class FabricChange:
    """A parsed ``fabric:`` mapping: the keys it sets (health merged key by key)."""

    values: Mapping[str, Any]

    def over(self, base: FabricSpec) -> FabricSpec:
        """``base`` with this change applied."""
        values = dict(self.values)
        if "health" in values:
            values["health"] = {**base.health, **values["health"]}
        return dataclasses.replace(base, **values)


def status_code(name: str) -> int:
    """The nvmlReturn code of a name such as SUCCESS or UNKNOWN (NVML_ERROR_ optional)."""
    if name == "SUCCESS":
        return pynvml.NVML_SUCCESS
    return int(getattr(pynvml, f"NVML_ERROR_{name.removeprefix('NVML_ERROR_')}"))


def parse_change(r: Reader, raw: Any, path: str) -> FabricChange:
    """Check a ``fabric:`` mapping; raises FleetError naming the path and the fix."""
    if isinstance(raw, FabricChange):
        return raw  # already checked (a fault of a loaded fleet, injected again)
    raw = r.mapping(raw, path, _KEYS)
    values: dict[str, Any] = {}
    if "state" in raw:
        values["state"] = _choice(r, raw["state"], join(path, "state"), STATES)
    if "status" in raw:
        status = r.string(raw["status"], join(path, "status")).upper()
        try:
            status_code(status)
        except AttributeError:
            r.fail(join(path, "status"), f"'{status}' is not an NVML return code (SUCCESS, ...)")
        values["status"] = status
    if "clique_id" in raw:
        values["clique_id"] = r.integer(raw["clique_id"], join(path, "clique_id"), 0, 2**32 - 1)
    if "cluster_uuid" in raw:
        text = r.string(raw["cluster_uuid"], join(path, "cluster_uuid"))
        try:
            values["cluster_uuid"] = str(uuid.UUID(text))
        except ValueError:
            r.fail(join(path, "cluster_uuid"), f"'{text}' is not a UUID")
    if "health" in raw:
        values["health"] = _health(r, raw["health"], join(path, "health"))
    if "summary" in raw:
        values["summary"] = _choice(r, raw["summary"], join(path, "summary"), SUMMARIES)
    return FabricChange(values)


def _health(r: Reader, raw: Any, path: str) -> dict[str, str]:
    raw = r.mapping(raw, path, tuple(HEALTH))
    out = {}
    for key, value in raw.items():
        kpath = join(path, key)
        names = HEALTH[key][1]
        if isinstance(value, bool) and names[0] == "true":
            value = "true" if value else "false"
        out[key] = _choice(r, value, kpath, names)
    return out


def _choice(r: Reader, raw: Any, path: str, names: Any) -> str:
    value = r.string(raw, path)
    if value not in names:
        r.fail(path, f"'{value}' is not one of {', '.join(names)}")
    return value


def for_gpu(
    r: Reader, fabric_capable: bool, name: str, node: FabricChange | None, raw: Any, path: str
) -> FabricSpec | None:
    """A GPU's fabric from the node's ``fabric:`` and its own (None: the board has none)."""
    if not fabric_capable:
        if raw is not None:
            r.fail(path, f"{name} does not register with an NVLink fabric; remove 'fabric'")
        return None
    spec = FabricSpec()
    if node is not None:
        spec = node.over(spec)
    if raw is not None:
        spec = parse_change(r, raw, path).over(spec)
    return spec
