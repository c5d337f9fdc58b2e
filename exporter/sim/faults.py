"""Fault: one thing that goes wrong on a simulated node, and when.

The kinds themselves (their keys, checks and effects) are classes in
exporter/sim/faultkinds.py; a fault mapping is checked by exporter/sim/faultcheck.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fault:
    """One fault, at sim time `at` seconds (None: now when injected, 0 in a fleet file).

    kind: lost | not_supported | xid | slow | driver_unloaded | driver_upgrade |
    mig_reconfigure | ecc_dbe | overheat | fabric. `gpu` is the GPU index (all GPUs when
    None, for not_supported, slow and fabric). See docs/simulator.md for what each kind does.
    """

    kind: str
    gpu: int | None = None
    at: float | None = None
    xid: int | None = None
    gi: int | None = None
    count: int = 1
    function: str | None = None
    field: int | None = None
    seconds: float | None = None
    duration: float | None = None
    temp_c: float | None = None
    mig: Any = None
    code: str | None = None
    fabric: Any = None  # a fabric fault's change (exporter/sim/fabricspec.py)
    version: str | None = None
    reload: bool = True

    def as_raw(self) -> dict[str, Any]:
        """The fault as a fleet-file mapping (only the keys that were set)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if getattr(self, f.name) != f.default}
