"""The fleet-file loader on any YAML: a Fleet or one FleetError naming the file, nothing else."""

from __future__ import annotations

import copy
from typing import Any

import pynvml
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from exporter import sim
from exporter.sim.fleet import FLEETS_DIR, Fleet, load_fleet
from exporter.sim.schema import FleetError
from tests.fuzz.strategies import FAST, TEXT, yaml_like

BASES = [yaml.safe_load(p.read_text()) for p in sorted(FLEETS_DIR.glob("*.yaml"))]
KEYS = [
    "hostname", "driver_version", "nvml_version", "cuda_driver_version", "latency", "gpus",
    "faults", "missing_functions", "model", "uuid", "pci_bus_id", "serial", "load",
    "processes", "mig", "profile", "gi", "ci", "index", "util", "mem_util", "mem_used_mib",
    "power", "swing", "period_s", "pid", "used_memory_mib", "sm_util", "type", "kind", "at",
    "gpu", "xid", "count", "function", "field", "seconds", "duration", "temp_c", "version",
    "reload", "mig_monitor", "ecc", "enabled", "default_us", "per_field_us", "functions",
]  # fmt: skip
VALUES = yaml_like(KEYS)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_fleet(draw: st.DrawFn) -> Any:
    """A shipped fleet with a few places replaced by arbitrary YAML values."""
    data = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(data)))
        new = draw(VALUES)
        if not path:
            data = new
            continue
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = new
        if not isinstance(data, dict | list):
            break
    return data


def _check(data: Any) -> None:
    try:
        fleet = Fleet.from_dict(data, "fuzz.yaml")
    except FleetError as e:
        assert str(e).startswith("fuzz.yaml"), e
        return
    assert fleet.gpus  # a fleet that loads has GPUs


@FAST
@given(mutated_fleet())
def test_mutated_fleets_load_or_raise_fleet_error(data):
    _check(data)


@FAST
@given(VALUES)
def test_any_yaml_value_loads_or_raises_fleet_error(data):
    _check(data)


@FAST
@given(st.one_of(TEXT, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_any_file_text_loads_or_raises_fleet_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fleet") / "node.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_fleet(path)
    except FleetError as e:
        assert str(e).startswith(str(path))


@pytest.mark.parametrize("path", sorted(FLEETS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_the_fleets_mutated_above_load_as_they_are(path):
    """Each shipped fleet, unmutated, is what pynvml then reports: its GPUs in file
    order with their models, and on each MIG GPU as many MIG devices as it lists."""
    data = yaml.safe_load(path.read_text())
    sim.install(path)
    try:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == len(data["gpus"])
        for i, spec in enumerate(data["gpus"]):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            assert pynvml.nvmlDeviceGetName(h) == spec["model"], (path.name, i)
            migs = []
            if spec.get("mig"):
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        migs.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j))
                    except pynvml.NVMLError_NotFound:
                        continue
            assert len(migs) == len(spec.get("mig") or []), (path.name, i)
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()
