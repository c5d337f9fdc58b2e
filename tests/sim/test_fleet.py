"""Fleet files: the shipped ones load, bad ones fail with one clear line."""

from __future__ import annotations

import pynvml
import pytest

from exporter.sim import FLEETS_DIR, Fleet, FleetError, load_fleet
from exporter.sim.models import catalog, profile_name
from tests.sim.conftest import FIXTURES
from tests.sim.handles import handle, mig_handles


@pytest.mark.parametrize("path", sorted(FLEETS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_fleets_load(path):
    fleet = load_fleet(path)
    assert fleet.gpus and fleet.latency.enabled


def test_benchmark_fleet_has_56_mig_devices(install):
    install(FLEETS_DIR / "h100x8-mig56.yaml")
    migs = [m for i in range(8) for m in mig_handles(handle(i))]
    assert len(migs) == 56
    assert len({pynvml.nvmlDeviceGetUUID(m) for m in migs}) == 56


def test_catalog_profiles_round_up_to_their_names():
    h100 = catalog()["NVIDIA H100 80GB HBM3"]
    assert [(p.name, p.id) for p in h100.mig_profiles] == [
        ("1g.10gb", 19),
        ("1g.20gb", 15),
        ("2g.20gb", 14),
        ("3g.40gb", 9),
        ("4g.40gb", 5),
        ("7g.80gb", 0),
    ]
    for model in catalog().values():
        for p in model.mig_profiles:
            assert profile_name(p.slices, p.memory_mib) == p.name


def bad(data) -> str:
    with pytest.raises(FleetError) as err:
        Fleet.from_dict(data, source="node.yaml")
    return str(err.value)


H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"gpus": [{"model": H100, "processes": [{"pid": 1, "type": "cuda"}]}]},
            "node.yaml: gpus[0].processes[0].type: 'cuda' is not compute, graphics or mps",
        ),
        (
            {"gpus": [{"model": "H100"}]},
            "node.yaml: gpus[0].model: unknown model 'H100'; known: NVIDIA H100",
        ),
        (
            {"gpus": [{"model": H100, "lod": 1}]},
            "node.yaml: gpus[0].lod: unknown key; known keys: model,",
        ),
        (
            {"gpus": [{"model": H100}, {"model": "NVIDIA L4", "mig": [{"profile": "1g.5gb"}]}]},
            "node.yaml: gpus[1].mig: NVIDIA L4 has no MIG; remove 'mig'",
        ),
        (
            {"gpus": [{"model": H100, "mig": [{"profile": "7g.80gb"}, {"profile": "1g.10gb"}]}]},
            "node.yaml: gpus[0].mig[1]: the layout needs 8 compute slices by this entry",
        ),
        (
            {
                "gpus": [
                    {
                        "model": H100,
                        "mig": [{"profile": "4g.40gb"}, {"profile": "3g.40gb", "gi": 1}],
                    }
                ]
            },
            "node.yaml: gpus[0].mig: 4g.40gb, 3g.40gb do not fit together on the memory slices",
        ),
        (
            {"gpus": [{"model": H100, "mig": [{"profile": "3g.40gb", "gi": 7}]}]},
            "node.yaml: gpus[0].mig[0]: GPU instance id 7 is not a placement of 3g.40gb;"
            " valid ids: 1, 2",
        ),
        (
            {"gpus": [{"model": H100, "processes": [{"pid": 1, "used_memory_mib": 90000}]}]},
            "node.yaml: gpus[0]: 90000 MiB in use is more than the 80980 MiB",
        ),
        (
            {"gpus": [{"model": H100, "processes": [{"pid": 1}, {"pid": 1}]}]},
            "node.yaml: gpus[0].processes[1].pid: pid 1 is listed twice",
        ),
        (
            {"gpus": [{"model": H100, "load": {"util": 120}}]},
            "node.yaml: gpus[0].load.util: 120 is above the maximum 100",
        ),
        (
            {"gpus": [{"model": H100}], "faults": [{"kind": "lost"}]},
            "node.yaml: faults[0]: lost faults need 'gpu'",
        ),
        (
            {"gpus": [{"model": H100}], "faults": [{"kind": "overheat", "gpu": 0, "xid": 3}]},
            "node.yaml: faults[0].xid: does not apply to overheat faults",
        ),
        (
            {"gpus": [{"model": H100}], "latency": {"functions": {"nvmlGetFan": 3}}},
            "node.yaml: latency.functions.nvmlGetFan: 'nvmlGetFan' is not an NVML function",
        ),
        (
            {"gpus": [{"model": H100}], "missing_functions": ["nvmlFoo"]},
            "node.yaml: missing_functions[0]: 'nvmlFoo' is not an NVML function",
        ),
    ],
)
def test_loader_errors(data, message):
    assert bad(data).startswith(message)


def test_error_names_file_path_and_known_profiles():
    with pytest.raises(FleetError) as err:
        load_fleet(FIXTURES / "bad_profile.yaml")
    assert str(err.value) == (
        f"{FIXTURES / 'bad_profile.yaml'}: gpus[2].mig[1].profile: unknown profile '9g.90gb'"
        f" for {H100}; known: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
    )


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(FleetError, match=r"missing.yaml: cannot read the fleet file"):
        load_fleet(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n  - {model: x\n")
    with pytest.raises(FleetError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_fleet(broken)
    with pytest.raises(FleetError, match=r"broken.yaml: expected a mapping, got a list"):
        broken.write_text("- 1\n")
        load_fleet(broken)


def test_older_driver_lacks_functions(install):
    install(FIXTURES / "old_driver.yaml")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(handle(0), version=pynvml.nvmlMemory_v2)
    assert pynvml.nvmlDeviceGetMemoryInfo(handle(0)).total > 0
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle(0)) == []
