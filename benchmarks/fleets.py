"""The simulated nodes the benchmark runs on, as fleet mappings (docs/simulator.md).

Whole-GPU fleets are generated (all H100, so cost per GPU is comparable from
1 to 64); the MIG node is the shipped ``h100x8-mig56.yaml``. Every GPU or MIG
instance runs one process, as on a busy node; the latency model is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter.sim import FLEETS_DIR

H100 = "NVIDIA H100 80GB HBM3"
MIG56 = Path(FLEETS_DIR) / "h100x8-mig56.yaml"
DEFAULT = Path(FLEETS_DIR) / "default.yaml"

# Two layouts of one H100 that MIG churn alternates between (7 and 4 instances).
LAYOUT_SEVEN = [{"profile": "1g.10gb"}] * 7
LAYOUT_MIXED = [
    {"profile": "3g.40gb"},
    {"profile": "2g.20gb"},
    {"profile": "1g.10gb"},
    {"profile": "1g.10gb"},
]


@dataclass(frozen=True)
class FleetCase:
    """One node to measure: a name for tables, the mapping, and its device counts."""

    name: str
    mapping: dict[str, Any]
    gpus: int
    mig: int

    @property
    def devices(self) -> int:
        """Physical GPUs plus MIG instances: what collection cost is linear in."""
        return self.gpus + self.mig

    def write(self, folder: Path) -> Path:
        """The fleet as a YAML file (for exporter processes); returns its path."""
        path = folder / f"fleet-{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.mapping, sort_keys=False))
        return path


def whole_gpus(n: int) -> FleetCase:
    """n whole H100s, each running one process at a different load."""
    gpus = []
    for i in range(n):
        util = 20 + (i * 37) % 75
        pid = 70000 + i
        gpus.append(
            {
                "model": H100,
                "load": {"util": util},
                "processes": [{"pid": pid, "used_memory_mib": 8000 + 611 * i % 60000}],
            }
        )
    mapping = {"hostname": f"bench-h100x{n}", "latency": {"enabled": True}, "gpus": gpus}
    return FleetCase(f"{n}gpu", mapping, n, 0)


def mig56() -> FleetCase:
    """8x H100, each split into seven 1g.10gb instances (56 MIG devices)."""
    mapping = yaml.safe_load(MIG56.read_text())
    mapping.setdefault("latency", {})["enabled"] = True
    return FleetCase("8gpu-mig56", mapping, 8, 56)


def default() -> FleetCase:
    """The shipped default fleet (8x H100, MIG on two of them), latency model on."""
    mapping = yaml.safe_load(DEFAULT.read_text())
    mapping.setdefault("latency", {})["enabled"] = True
    mig = sum(len(g.get("mig") or []) for g in mapping["gpus"])
    return FleetCase("default", mapping, len(mapping["gpus"]), mig)


def tiny_mig() -> FleetCase:
    """2x H100, one of them with two MIG instances: the --quick stand-in for mig56."""
    mapping = {
        "hostname": "bench-tiny",
        "latency": {"enabled": True},
        "gpus": [
            {"model": H100, "processes": [{"pid": 71000, "used_memory_mib": 9000}]},
            {
                "model": H100,
                "mig": [
                    {"profile": "3g.40gb", "processes": [{"pid": 71100, "used_memory_mib": 9000}]},
                    {"profile": "1g.10gb"},
                ],
            },
        ],
    }
    return FleetCase("2gpu-mig2", mapping, 2, 2)


def scaling(quick: bool) -> list[FleetCase]:
    """The fleets of the growth study, smallest first."""
    if quick:
        return [whole_gpus(1), tiny_mig()]
    return [
        whole_gpus(1),
        whole_gpus(8),
        default(),
        mig56(),
        whole_gpus(16),
        whole_gpus(32),
        whole_gpus(64),
    ]


def target(quick: bool) -> FleetCase:
    """The node the targets are set for (8x H100 with 56 MIG instances)."""
    return tiny_mig() if quick else mig56()
