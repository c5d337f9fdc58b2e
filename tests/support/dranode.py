"""An exporter on a simulated node whose pods hold their GPUs through DRA claims.

The simulator's kubelet (``--simulate -k``) serves the fleet's claims; the fake API
server serves the ResourceSlice the simulator builds for the fleet
(exporter/sim/resourceslices.py), with the taints asked for, the devices shared by
consumable capacity and the ResourceClaims given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exporter import sim
from exporter.sim.resourceslices import resource_slice
from tests.procs import Exporter
from tests.support.fakeapi import FakeAPIServer

NODE = "sim-node"  # the exporter's NODE_NAME (benchmarks/procs.py), and the fleets' hostname


def kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for the API server at ``url``, written to ``path``."""
    cluster = {"name": "f", "cluster": {"server": url}}
    context = {"name": "f", "context": {"cluster": "f", "user": "u"}}
    doc = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": [context]}
    doc |= {"users": [{"name": "u", "user": {"token": "t"}}], "current-context": "f"}
    path.write_text(json.dumps(doc))
    return path


@contextmanager
def dra_node(
    tmp_path: Path,
    fleet_text: str,
    version: str = "v1",
    taints: Mapping[str, list[dict[str, str]]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    shared: tuple[str, ...] = (),
    claims: list[dict[str, Any]] | None = None,
) -> Iterator[tuple[Exporter, dict[str, Any], Any]]:
    """(the running exporter, the ResourceSlice served, the simulated GPUs as the fleet
    starts) for the fleet ``fleet_text``; ``pods`` and ``claims``: the API server's pod and
    ResourceClaim objects; ``shared``: devices published with allowMultipleAllocations."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    driver = sim.install(fleet)
    try:
        doc = resource_slice(driver.gpus, NODE, version, taints, shared)
        gpus = driver.gpus
    finally:
        sim.uninstall()
    api = FakeAPIServer(pods=pods, slices=[doc], claims=claims, slice_versions=(version,))
    api.start()
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))}
    exp = Exporter(
        "-c", "300", "-k", "--kubernetes-dra",
        fleet=fleet,
        env={**env, "KUBERNETES_SERVICE_HOST": ""},
    )  # fmt: skip
    try:
        exp.wait_ready()
        yield exp, doc, gpus
    finally:
        exp.stop()
        api.stop()
