"""The NVML session: how each kind of NVML failure reaches a caller, and what is counted."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from exporter import sim
from exporter.nvml.session import (
    CallFailed,
    DeviceLost,
    DriverGone,
    NvmlProblem,
    Session,
    Unavailable,
)
from exporter.sim.clock import ManualClock

MIXED = Path(__file__).parents[2] / "tests" / "fixtures" / "fleets" / "mixed.yaml"


@pytest.fixture
def node():
    driver = sim.install(MIXED, clock=ManualClock())
    session = Session()
    session.open()
    try:
        yield driver, session
    finally:
        session.close()
        sim.uninstall()


def _counts(session: Session) -> dict[tuple[str, str], int]:
    return {(f, c): n for f, c, n in session.error_counts()}


def test_a_call_that_works_returns_the_answer_and_counts_nothing(node):
    _, session = node
    assert session.run("nvmlDeviceGetCount") == 5
    handle = session.run("nvmlDeviceGetHandleByIndex", 0)
    assert session.run("nvmlDeviceGetUUID", handle).startswith("GPU-")
    assert _counts(session) == {}


def test_each_failure_is_one_problem_kind_and_counted_by_function_and_code(node):
    driver, session = node
    h100, t4 = (session.run("nvmlDeviceGetHandleByIndex", i) for i in (0, 4))
    with pytest.raises(Unavailable) as got:
        session.run("nvmlDeviceGetMigMode", t4)  # a T4 has no MIG
    assert got.value.function == "nvmlDeviceGetMigMode"
    assert got.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED

    with pytest.raises(CallFailed):
        session.run("nvmlDeviceGetHandleByIndex", 99)  # INVALID_ARGUMENT

    driver.inject(sim.Fault("lost", gpu=0))
    with pytest.raises(DeviceLost):
        session.run("nvmlDeviceGetTemperature", h100, pynvml.NVML_TEMPERATURE_GPU)
    assert session.up

    pynvml.nvmlShutdown()  # NVML shut down under the session: unusable for good
    with pytest.raises(DriverGone):
        session.run("nvmlDeviceGetCount")
    assert not session.up  # the exporter exits: only a new process gets NVML back

    assert _counts(session) == {
        ("nvmlDeviceGetMigMode", "NOT_SUPPORTED"): 1,
        ("nvmlDeviceGetHandleByIndex", "INVALID_ARGUMENT"): 1,
        ("nvmlDeviceGetTemperature", "GPU_IS_LOST"): 1,
        ("nvmlDeviceGetCount", "UNINITIALIZED"): 1,
    }
    assert all(
        issubclass(k, NvmlProblem) for k in (Unavailable, DeviceLost, DriverGone, CallFailed)
    )


def test_an_empty_answer_is_none_and_not_an_error(node):
    _, session = node
    h100_mig = session.run("nvmlDeviceGetHandleByIndex", 1)  # three MIG devices of seven
    limit = session.run("nvmlDeviceGetMaxMigDeviceCount", h100_mig)
    gap = frozenset({pynvml.NVML_ERROR_NOT_FOUND})
    found = [
        session.run("nvmlDeviceGetMigDeviceHandleByIndex", h100_mig, j, empty=gap)
        for j in range(limit)
    ]
    assert sum(h is not None for h in found) == 3 and None in found
    assert _counts(session) == {}


def test_release_neither_raises_nor_counts(node):
    _, session = node
    sample = session.run("nvmlGpmSampleAlloc")
    pynvml.nvmlShutdown()  # NVML gone: the sample cannot be freed, and that is fine
    session.release("nvmlGpmSampleFree", sample)
    assert _counts(session) == {}


def test_a_c_call_fails_as_the_pynvml_call_does(node):
    driver, session = node
    h100, t4 = (session.run("nvmlDeviceGetHandleByIndex", i) for i in (0, 4))
    temp = ctypes.c_uint()
    assert session.c_call("nvmlDeviceGetTemperature", h100, 0, ctypes.byref(temp))
    assert temp.value == session.run("nvmlDeviceGetTemperature", h100, 0)
    mode, pending = ctypes.c_uint(), ctypes.c_uint()
    with pytest.raises(Unavailable) as got:
        session.c_call("nvmlDeviceGetMigMode", t4, ctypes.byref(mode), ctypes.byref(pending))
    assert (got.value.function, got.value.code) == (
        "nvmlDeviceGetMigMode",
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    )
    with pytest.raises(Unavailable):  # the driver lacks the function
        session.c_call("nvmlDeviceGetNoSuchThing", h100)
    gap = frozenset({pynvml.NVML_ERROR_NOT_FOUND})
    h100_mig = session.run("nvmlDeviceGetHandleByIndex", 1)  # three MIG devices of seven
    handle = pynvml.c_nvmlDevice_t()
    found = [
        session.c_call(
            "nvmlDeviceGetMigDeviceHandleByIndex", h100_mig, j, ctypes.byref(handle), empty=gap
        )
        for j in range(7)
    ]
    assert sum(found) == 3
    driver.inject(sim.Fault("lost", gpu=0))
    with pytest.raises(DeviceLost):
        session.c_call("nvmlDeviceGetTemperature", h100, 0, ctypes.byref(temp))
    pynvml.nvmlShutdown()
    with pytest.raises(DriverGone):
        session.c_call("nvmlDeviceGetCount_v2", ctypes.byref(temp))
    assert not session.up
    assert _counts(session) == {
        ("nvmlDeviceGetMigMode", "NOT_SUPPORTED"): 1,
        ("nvmlDeviceGetNoSuchThing", "FUNCTION_NOT_FOUND"): 1,
        ("nvmlDeviceGetTemperature", "GPU_IS_LOST"): 1,
        ("nvmlDeviceGetCount_v2", "UNINITIALIZED"): 1,
    }
