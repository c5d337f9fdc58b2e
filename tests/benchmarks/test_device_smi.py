"""The device check's reading of nvidia-smi (its output layouts, fields it does not know)
and its agreement rules, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.devicecheck.compare import CHECKS, Check, judge
from tools.devicecheck.nvsmi import GpuInstance, Smi, SmiError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvidia-smi"


def smi_answering(outputs: dict[str, str], unknown: set[str] = frozenset()):
    """An Smi whose nvidia-smi answers `mig` listings from files and refuses ``unknown``."""
    asked: list[list[str]] = []

    def run(args, timeout):
        asked.append(list(args))
        if args[0].startswith("--query-gpu="):
            fields = args[0].split("=", 1)[1].split(",")
            for f in fields:
                if f in unknown:
                    raise SmiError(f'Field "{f}" is not a valid field to query.')
            return "".join(
                ", ".join([str(i), *(f"{f}-{i}" for f in fields[1:])]) + "\n" for i in (0, 1)
            )
        return outputs[" ".join(args)]

    return Smi(run, 5.0), asked


def test_mig_listings_in_nvidia_smis_layout():
    outputs = {
        f"mig {flag}": (FIXTURES / f"mig{flag}.txt").read_text()
        for flag in ("-lgi", "-lci", "-lgip")
    }
    smi, _ = smi_answering(outputs)
    assert smi.mig_instances() == [
        GpuInstance(0, "3g.40gb", 9, 2),
        GpuInstance(0, "2g.20gb", 14, 3),
        GpuInstance(1, "1g.10gb", 19, 9),
        GpuInstance(0, "3g.40gb", 2, 2, 0),
        GpuInstance(0, "2g.20gb", 1, 3, 0),
        GpuInstance(1, "1g.10gb", 0, 9, 0),
    ]
    assert smi.mig_profiles() == {
        (0, "1g.10gb"): 9.5,
        (0, "1g.10gb+me"): 9.5,
        (0, "3g.40gb"): 39.25,
    }


def test_a_field_nvidia_smi_does_not_know_is_renamed_or_dropped():
    smi, asked = smi_answering({}, unknown={"clocks_event_reasons.active", "fabric.state"})
    rows, _ = smi.query(["clocks_event_reasons.active", "fabric.state", "uuid"])
    assert rows[1] == {
        "clocks_event_reasons.active": "clocks_throttle_reasons.active-1",
        "uuid": "uuid-1",
    }
    assert smi.dropped == ["fabric.state"]
    rows, _ = smi.query(["fabric.state", "uuid"])  # remembered: asked no more
    assert "fabric.state" not in asked[-1][0]


def test_na_answers_read_as_absent():
    def run(args, timeout):
        return "0, [N/A], N/A, [Not Supported], 7\n"

    rows, _ = Smi(run).query(["a", "b", "c", "d"])
    assert rows == {0: {"a": None, "b": None, "c": None, "d": "7"}}


def rule(field: str) -> Check:
    return next(c for c in CHECKS if c.field == field)


@pytest.mark.parametrize(
    ("field", "before", "x", "after", "verdict"),
    [
        ("DCGM_FI_DEV_GPU_TEMP", 60.0, 61, 62.0, "ok"),
        ("DCGM_FI_DEV_GPU_TEMP", 60.0, 64, 62.0, "MISMATCH"),  # 2 C outside, 1 C slack
        ("DCGM_FI_DEV_GPU_TEMP", None, 61, None, "EXTRA"),
        ("DCGM_FI_DEV_GPU_TEMP", 60.0, None, 60.0, "MISSING"),
        ("DCGM_FI_DEV_GPU_TEMP", None, None, None, "n/a"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 10.0, 11, 12.0, "ok"),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 10.0, 9, 12.0, "MISMATCH"),  # a counter went back
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", float(0x5), 0x4, float(0x4), "ok"),
        (
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            float(0x5),
            0x1,
            float(0x4),
            "MISMATCH",
        ),  # 0x4 in both
        (
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            float(0x5),
            0x15,
            float(0x4),
            "MISMATCH",
        ),  # 0x10 in neither
        ("UUID", "GPU-a", "GPU-a", "GPU-a", "ok"),
        ("UUID", "GPU-a", "GPU-b", "GPU-a", "MISMATCH"),
        ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", None, 0, None, "ok"),  # no fabric: N/A, DCGM's 0
    ],
)
def test_agreement_rules(field, before, x, after, verdict):
    assert judge(rule(field), before, x, after) == verdict


def test_fabric_status_from_state_and_status():
    status = rule("DCGM_FI_DEV_FABRIC_MANAGER_STATUS")
    assert status.smi_value({"fabric.state": "Completed", "fabric.status": "Success"}) == 3
    assert status.smi_value({"fabric.state": "Completed", "fabric.status": "Timeout"}) == 4
    assert status.smi_value({"fabric.state": "In Progress", "fabric.status": None}) == 2
    assert status.smi_value({"fabric.state": None, "fabric.status": None}) is None
