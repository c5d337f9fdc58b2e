"""Priming: first samples of new devices, so a cycle publishes rates at once.

GPM ratios (DCGM_FI_PROF_*) and DCGM's counter rates (field 449) need two
samples. For devices seen for the first time (at start, or the MIG instances of
a new layout) the cycle takes a first sample of each, waits MIN_GAP_S (100 ms)
once for all of them, and its normal reads then have the second sample. Later
cycles use the previous cycle's sample and do not wait.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.nvml.devices import Inventory
from exporter.nvml.gpm import MIN_GAP_S, GpmReader
from exporter.nvml.reader import FieldReader


def prime_new_devices(
    reader: FieldReader,
    gpm: GpmReader,
    inv: Inventory,
    now: float,
    skip: Callable[[str], bool] = lambda key: False,
) -> float:
    """Prime the devices of ``inv`` not sampled yet (physical GPU key ``skip``ped: left
    out); returns the seconds waited (0 or MIN_GAP_S)."""
    gpus = [g for g in inv.gpus if not skip(g.key)]
    entities = [e for e in inv.entities() if not skip((e.parent or e).key)]
    fields = reader.prime(gpus)
    profs = gpm.prime(entities, now, [g for g in gpus if g.key in inv.mig_enabled])
    if not (fields or profs):
        return 0.0
    gpm.sleep(MIN_GAP_S)
    return MIN_GAP_S
