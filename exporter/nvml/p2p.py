"""P2P status between GPU pairs (DCGM_EXP_P2P_STATUS data), from nvmlDeviceGetP2PStatus.

dcgm-exporter publishes, for every GPU and every other GPU, one series with
labels ``peer_gpu`` (the peer's index) and ``link_status`` (the status name),
whose value is the status code. It asks about NVLink P2P; so do we
(NVML_P2P_CAPS_INDEX_NVLINK). The answer changes only with the hardware, so it
is read once per set of GPUs. This module produces data; the exposition renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pynvml as N

from exporter.nvml.devices import Device
from exporter.nvml.session import CallFailed, NvmlProblem, Session, Unavailable

_NVLINK = N.NVML_P2P_CAPS_INDEX_NVLINK

# NVML's nvmlGpuP2PStatus_t codes and dcgm-exporter's names for them
STATUS_NAMES: dict[int, str] = {
    0: "OK",
    1: "ChipsetNotSupported",
    2: "GPUNotSupported",
    3: "TopologyNotSupported",
    4: "DisabledByRegKey",
    5: "NotSupported",
    6: "Unknown",
}


class P2PSeries(NamedTuple):
    """One series of a GPU: the peer's index, the status name and NVML's status code."""

    peer_gpu: int
    link_status: str
    value: int


def status_name(code: int) -> str:
    """dcgm-exporter's name of an NVML P2P status code ("Unknown" for others)."""
    return STATUS_NAMES.get(code, "Unknown")


def p2p_series(matrix: Mapping[tuple[int, int], int]) -> dict[int, tuple[P2PSeries, ...]]:
    """Series by GPU index from {(gpu index, peer index): status code}; a GPU and itself skipped."""
    out: dict[int, list[P2PSeries]] = {}
    for (i, j), code in sorted(matrix.items()):
        if i != j:
            out.setdefault(i, []).append(P2PSeries(j, status_name(code), code))
    return {i: tuple(s) for i, s in out.items()}


class P2PReader:
    """Reads the NVLink P2P status of every GPU pair once per set of GPUs."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._gpus: tuple[str, ...] = ()
        self._series: dict[int, tuple[P2PSeries, ...]] = {}

    def read(self, gpus: Sequence[Device]) -> dict[int, tuple[P2PSeries, ...]]:
        """Series by GPU index; pairs NVML cannot answer for are left out (counted)."""
        keys = tuple(g.key for g in gpus)
        if keys == self._gpus:
            return self._series
        matrix: dict[tuple[int, int], int] = {}
        for a in gpus:
            for b in gpus:
                if a is b:
                    continue
                try:
                    code = self.session.run("nvmlDeviceGetP2PStatus", a.handle, b.handle, _NVLINK)
                except (Unavailable, CallFailed):
                    continue  # counted; this pair is left out
                except NvmlProblem:
                    return self._series  # a GPU lost or the driver gone: try next cycle
                matrix[(a.index, b.index)] = int(code)
        self._gpus, self._series = keys, p2p_series(matrix)
        return self._series
