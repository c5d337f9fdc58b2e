"""Fixtures: a simulated driver installed under pynvml, always uninstalled afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from exporter import sim
from exporter.sim import FLEETS_DIR, ManualClock, SimDriver

MIXED = FLEETS_DIR / "mixed.yaml"
DEFAULT = FLEETS_DIR / "default.yaml"
FIXTURES = Path(__file__).parent / "fleets"


@pytest.fixture(autouse=True)
def _always_uninstall() -> Iterator[None]:
    yield
    sim.uninstall()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def install(clock: ManualClock) -> Callable[..., SimDriver]:
    """install(fleet=None, latency=False, init=True) -> driver on the test's ManualClock."""

    def _install(fleet=None, *, latency: bool = False, init: bool = True) -> SimDriver:
        driver = sim.install(fleet, clock=clock, latency=latency)
        if init:
            pynvml.nvmlInit()
        return driver

    return _install


@pytest.fixture
def default(install) -> SimDriver:
    """The default fleet: 8x H100, MIG on GPUs 6 and 7."""
    return install()


@pytest.fixture
def mixed(install) -> SimDriver:
    """H100 (no MIG), A100-40GB with MIG, L4, T4."""
    return install(MIXED)
