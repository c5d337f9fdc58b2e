"""A simulated NVML driver below pynvml: pynvml's own code runs, the simulation answers.

    from exporter.sim import install, uninstall, Fault, ManualClock
    driver = install("exporter/sim/fleets/mixed.yaml", clock=ManualClock())
    pynvml.nvmlInit()            # talks to the simulation
    driver.inject(Fault("xid", gpu=0, xid=79))
    driver.advance(10)
    uninstall()

See docs/simulator.md for the fleet file format, faults and the latency model.
"""

from exporter.sim.clock import ManualClock
from exporter.sim.driver import SimDriver, current, install, uninstall
from exporter.sim.faults import Fault
from exporter.sim.fleet import DEFAULT_FLEET, FLEETS_DIR, Fleet, load_fleet
from exporter.sim.schema import FleetError

__all__ = [
    "DEFAULT_FLEET",
    "FLEETS_DIR",
    "Fault",
    "Fleet",
    "FleetError",
    "ManualClock",
    "SimDriver",
    "current",
    "install",
    "load_fleet",
    "uninstall",
]
