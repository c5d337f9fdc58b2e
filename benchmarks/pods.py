"""The pods dimension: 0, 60 and 1,000 pods on the node, served by benchmarks/kubelet.py.

Pods take the node's GPU devices first, one each (whole GPUs and MIG
instances, as the NVIDIA device plugin hands them out with the single MIG
strategy); the pods beyond that hold no GPU, as CPU pods on a dense node do.
The kubelet lists every pod either way, so its answer, and the exporter's
work on it, grows with the pod count. Time-sliced sharing is not part of the
benchmark: splitting a shared GPU between containers needs the API server and
the host's /proc, which the harness does not stand in for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COUNTS = (0, 60, 1000)
RESOURCE = "nvidia.com/gpu"


def device_ids(fleet: Path | dict[str, Any]) -> list[str]:
    """UUIDs a device plugin would hand out on this node: MIG instances, whole GPUs."""
    from exporter import sim

    driver = sim.install(fleet)
    try:
        return device_ids_of(driver)
    finally:
        sim.uninstall()


def device_ids_of(driver: Any) -> list[str]:
    """The same for an installed simulated driver, in its current MIG layout."""
    out = []
    for g in driver.gpus:
        if g.mig_enabled:
            out.extend(m.uuid for m in g.migs)
        else:
            out.append(g.uuid)
    return out


def assignments(ids: list[str], n: int, replaced: int = 0) -> dict[str, Any]:
    """A pod-resources List answer with n pods, the first len(ids) holding one device each.

    ``replaced`` counts pods replaced so far, round robin over the n slots: a
    replaced pod comes back under a new name, as a new pod of a Deployment does.
    """
    pods = []
    for i in range(n):
        gen = replaced // n + (1 if i < replaced % n else 0) if n else 0
        container: dict[str, Any] = {"name": "main"}
        if i < len(ids):
            container["devices"] = [{"resource_name": RESOURCE, "device_ids": [ids[i]]}]
        name = f"bench-{i:04d}-g{gen}"
        pods.append({"name": name, "namespace": f"team-{i % 7}", "containers": [container]})
    return {"pod_resources": pods}


def write(path: Path, ids: list[str], n: int, replaced: int = 0) -> None:
    """Write the answer for the stand-in kubelet (atomically: it re-reads on change)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(assignments(ids, n, replaced)))
    tmp.replace(path)
