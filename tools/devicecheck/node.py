"""Which node the device check runs on: the real driver when one answers, else the simulator.

No flag is needed to find the driver: pynvml loads ``libnvidia-ml.so.1`` as the dynamic
loader finds it, and where that fails the usual install places (the NVIDIA container
toolkit's, the GPU Operator's driver container mount) are tried. nvidia-smi is looked
up the same way (tools/devicecheck/nvsmi.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml as N

from exporter import sim
from exporter.sim.driver import SimDriver
from tools.devicecheck import nvsmi, simsmi

LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
)


class Unusable(RuntimeError):
    """The check cannot run here; the message says why and what to do."""


@dataclass
class Node:
    simulated: bool
    smi: nvsmi.Smi
    where: str  # the driver library or fleet file, for the report
    driver: SimDriver | None = None
    fleet: Path | None = None
    why: str = ""  # why the simulator runs when no --simulate asked for it

    def close(self) -> None:
        if self.simulated:
            sim.uninstall()
        else:
            with contextlib.suppress(N.NVMLError):
                N.nvmlShutdown()


class NoDriver(Exception):
    """No usable NVIDIA driver on this machine; the message says what was found."""


def _load_real() -> str:
    """Initialise NVML on the real library; its path. NoDriver when there is none."""
    try:
        N.nvmlInit()
        return "libnvidia-ml.so.1 (dynamic loader)"
    except N.NVMLError_LibraryNotFound:
        pass
    except N.NVMLError as e:
        raise NoDriver(f"libnvidia-ml.so.1 is here but NVML does not start: {e}") from None
    for d in LIBRARY_DIRS:
        path = os.path.join(d, "libnvidia-ml.so.1")
        if not os.path.exists(path):
            continue
        with N.libLoadLock:
            N.nvmlLib = ctypes.CDLL(path)
        try:
            N.nvmlInit()
        except N.NVMLError as e:
            raise NoDriver(f"{path} is here but NVML does not start: {e}") from None
        return path
    raise NoDriver("no NVIDIA driver here (libnvidia-ml.so.1 not found)")


def open_node(simulate: Path | None, force_real: bool, timeout: float) -> Node:
    """The real node if it has a driver (or ``force_real``), else the simulated ``simulate``."""
    why = ""
    if simulate is None:
        try:
            where = _load_real()
        except NoDriver as e:
            if force_real:
                raise Unusable(f"{e}; drop --real to run on the simulator") from None
            with N.libLoadLock:
                N.nvmlLib = None
            why, simulate = str(e), sim.DEFAULT_FLEET
        else:
            binary = nvsmi.find()
            if binary is None:
                raise Unusable(
                    "NVML answers but nvidia-smi is neither on PATH nor in "
                    + ", ".join(nvsmi.PLACES)
                    + ": put it on PATH"
                )
            return Node(False, nvsmi.Smi(nvsmi.runner(binary), timeout), where)
    driver = sim.install(simulate)
    N.nvmlInit()
    smi = nvsmi.Smi(simsmi.standin(driver), timeout)
    return Node(True, smi, str(simulate), driver, simulate, why)


def describe(node: Node) -> dict[str, Any]:
    """Driver, NVML and CUDA versions, and the GPUs, for the report's header."""

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
    names = [text(N.nvmlDeviceGetName(h)) for h in handles]
    cuda = N.nvmlSystemGetCudaDriverVersion()
    return {
        "mode": "simulator (nvidia-smi stand-in reads its true state)"
        if node.simulated
        else "real GPUs",
        "driver library" if not node.simulated else "fleet": node.where,
        **({"why the simulator": node.why} if node.why else {}),
        "driver": text(N.nvmlSystemGetDriverVersion()),
        "NVML": text(N.nvmlSystemGetNVMLVersion()),
        "CUDA driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "pynvml": _version("nvidia-ml-py"),
        "GPUs": ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names)),
    }


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
