"""XIDs after which the driver is not called again for the GPU (XID 119, GSP timeout).

DCGM's cache manager stops calling the driver once /dev/kmsg reports XID 119
(ReadEnvForFatalXids' default; DcgmCacheManager.cpp, m_skipDriverCalls), blanks the
fields and logs "Hostengine restart required": a GPU whose GSP timed out answers every
call only after the RPC timeout, if at all. The exporter does the same for the GPU that
reported it (DCGM stops for every GPU), whichever way the XID arrived, until it restarts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from exporter.nvml.devices import Device
from exporter.nvml.xid.events import XidState

log = logging.getLogger(__name__)

FATAL_XIDS = frozenset({119})


def stop(gpus: Iterable[Device], state: XidState, aside: dict[str, float]) -> None:
    """Set the GPUs of ``gpus`` with a fatal XID in ``state`` aside for good (``aside``: GPU
    key -> until when, :data:`math.inf` for good), logging one line for each."""
    by_uuid = {g.uuid: g for g in gpus if not g.is_mig}
    for uuid, _gi, _ci, xid, n in state.counts:
        gpu = by_uuid.get(uuid)
        if gpu is None or n <= 0 or xid not in FATAL_XIDS or aside.get(gpu.key) == math.inf:
            continue
        aside[gpu.key] = math.inf
        log.error(
            "GPU %d (%s): XID %d (GSP timeout): no more driver calls for this GPU until the "
            "exporter restarts (as DCGM: 'Hostengine restart required'); check that "
            "nvidia-smi answers before restarting it",
            gpu.index,
            gpu.uuid,
            xid,
        )


def aside(gpu: Device, left_s: float) -> str:
    """Why ``gpu`` is not read this cycle (/ready), ``left_s`` seconds before it is again."""
    if left_s == math.inf:
        why = "until the exporter restarts: XID 119 (GSP timeout)"
    else:
        why = f"for {left_s:.0f} s more: its NVML calls were slow"
    return f"GPU {gpu.index} ({gpu.uuid}) set aside {why}"
