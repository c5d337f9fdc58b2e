"""The fleet model: one simulated node (its GPUs, MIG layouts, load, processes, faults).

A fleet is loaded from a YAML file (see docs/simulator.md) or a mapping of the
same shape; every problem is one FleetError naming the file, the path inside
it and what to do. The loaded Fleet is immutable; the driver keeps run-time
state separately.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from exporter.sim import fabricspec
from exporter.sim import mig as miglayout
from exporter.sim.faultcheck import parse_fault
from exporter.sim.faults import Fault
from exporter.sim.latency import LatencySpec
from exporter.sim.library import implemented_names
from exporter.sim.models import GpuModel, MigProfile, catalog
from exporter.sim.pods import PodSpec, parse_pods
from exporter.sim.schema import FleetError, Reader, join
from exporter.sim.specs import (
    GpuSpec,
    LoadSpec,
    MigSpec,
    ProcessSpec,
    default_bus_id,
    default_uuid,
    digest,
    memory_in_use_mib,
    mig_uuid,
)

__all__ = [
    "DEFAULT_FLEET",
    "FLEETS_DIR",
    "Fleet",
    "FleetError",
    "GpuSpec",
    "LoadSpec",
    "MigSpec",
    "ProcessSpec",
    "coerce",
    "default_bus_id",
    "default_uuid",
    "load_fleet",
    "memory_in_use_mib",
    "mig_uuid",
]

FLEETS_DIR = Path(__file__).with_name("fleets")
DEFAULT_FLEET = FLEETS_DIR / "default.yaml"
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")

_TOP_KEYS = ("hostname", "driver_version", "nvml_version", "cuda_driver_version", "latency",
             "missing_functions", "fabric", "mig_monitor", "gpus", "faults", "pods")  # fmt: skip
_GPU_KEYS = ("model", "uuid", "pci_bus_id", "serial", "ecc", "load", "processes", "mig",
             "fabric")  # fmt: skip
_MIG_KEYS = ("profile", "gi", "ci", "index", "uuid", "load", "processes")
_LOAD_KEYS = ("util", "mem_util", "mem_used_mib", "power", "swing", "period_s", "enc", "dec")
_PROCESS_KEYS = ("pid", "used_memory_mib", "sm_util", "mem_util", "type", "start", "end")


@dataclass(frozen=True)
class Fleet:
    """One simulated node."""

    source: str
    hostname: str
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSpec, ...]
    faults: tuple[Fault, ...] = ()
    latency: LatencySpec = field(default_factory=LatencySpec)
    missing_functions: frozenset[str] = frozenset()
    mig_monitor: bool = True  # the caller may watch MIG instances (root, CAP_SYS_ADMIN)
    pods: tuple[PodSpec, ...] = ()  # the kubelet's side: exporter/sim/pods.py

    @classmethod
    def from_dict(cls, data: Any, source: str = "<fleet>") -> Fleet:
        """Build a fleet from a mapping shaped like a fleet file."""
        return _Loader(Reader(source)).fleet(data)

    def parse_fault(self, fault: Fault, source: str = "<inject>") -> Fault:
        """Check a fault against this fleet; returns it with its MIG layout resolved."""
        loader = _Loader(Reader(source), self.hostname)
        models = [g.model for g in self.gpus]
        return loader.fault(fault.as_raw(), "fault", models)


def load_fleet(path: str | Path) -> Fleet:
    """Load a fleet file; raises FleetError naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise FleetError(f"{path}: cannot read the fleet file: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise FleetError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    return Fleet.from_dict(data, str(path))


class _Loader:
    def __init__(self, reader: Reader, hostname: str = "sim-node") -> None:
        self.r = reader
        self.hostname = hostname
        self.fabric: fabricspec.FabricChange | None = None  # the node's `fabric:`

    def fleet(self, data: Any) -> Fleet:
        r = self.r
        data = r.mapping(data, "", _TOP_KEYS, ("gpus",))
        self.hostname = r.string(data.get("hostname", "sim-node"), "hostname")
        driver = r.string(data.get("driver_version", "580.95.05"), "driver_version")
        digits = re.match(r"\d+", driver)
        major = int(digits.group()) if digits else 0
        cuda_default = 13000 if major >= 580 else 12000
        cuda = r.integer(
            data.get("cuda_driver_version", cuda_default), "cuda_driver_version", lo=1000
        )
        nvml = r.string(data.get("nvml_version", f"{cuda // 1000}.{driver}"), "nvml_version")
        names = implemented_names()
        missing = frozenset(
            self._function(v, join("missing_functions", i), names)
            for i, v in enumerate(r.sequence(data.get("missing_functions"), "missing_functions"))
        )
        raw_gpus = r.sequence(data["gpus"], "gpus")  # [] is a node with no GPU visible
        if data.get("fabric") is not None:
            self.fabric = fabricspec.parse_change(r, data["fabric"], "fabric")
        gpus = tuple(self.gpu(g, join("gpus", i), i) for i, g in enumerate(raw_gpus))
        if self.fabric is not None and all(g.fabric is None for g in gpus):
            r.fail("fabric", "no GPU of this node registers with an NVLink fabric")
        for key in ("uuid", "pci_bus_id", "serial"):
            seen: dict[str, int] = {}
            for g in gpus:
                value = getattr(g, key)
                if value in seen:
                    r.fail(
                        join(join("gpus", g.index), key), f"'{value}' is also GPU {seen[value]}'s"
                    )
                seen[value] = g.index
        models = [g.model for g in gpus]
        faults = tuple(
            self.fault(f, join("faults", i), models)
            for i, f in enumerate(r.sequence(data.get("faults"), "faults"))
        )
        return Fleet(
            source=r.source,
            hostname=self.hostname,
            driver_version=driver,
            nvml_version=nvml,
            cuda_driver_version=cuda,
            gpus=gpus,
            faults=faults,
            latency=self.latency(data.get("latency"), names),
            missing_functions=missing,
            mig_monitor=r.boolean(data.get("mig_monitor", True), "mig_monitor"),
            pods=parse_pods(r, data.get("pods"), gpus),
        )

    def fault(self, raw: Any, path: str, models: list[GpuModel]) -> Fault:
        def layout(value: Any, lpath: str, gpu: int) -> tuple[MigSpec, ...] | None:
            return self.layout(value, lpath, models[gpu])

        return parse_fault(self.r, raw, path, models, layout, implemented_names())

    def _function(self, value: Any, path: str, names: frozenset[str]) -> str:
        name = self.r.string(value, path)
        if name not in names:
            self.r.fail(path, f"'{name}' is not an NVML function the simulator implements")
        return name

    def latency(self, raw: Any, names: frozenset[str]) -> LatencySpec:
        r = self.r
        if raw is None:
            return LatencySpec(enabled=False)
        raw = r.mapping(raw, "latency", ("enabled", "default_us", "per_field_us", "functions"))
        functions = raw.get("functions") or {}
        if not isinstance(functions, dict):
            r.fail("latency.functions", "expected a mapping of NVML function name to microseconds")
        for name in functions:
            self._function(name, join("latency.functions", str(name)), names)
        spec = LatencySpec(
            enabled=r.boolean(raw.get("enabled", True), "latency.enabled"),
            default_us=r.number(raw.get("default_us", 5.0), "latency.default_us", lo=0),
            per_field_us=r.number(raw.get("per_field_us", 1.0), "latency.per_field_us", lo=0),
            functions={
                k: r.number(v, join("latency.functions", k), lo=0) for k, v in functions.items()
            },
        )
        return spec

    def gpu(self, raw: Any, path: str, index: int) -> GpuSpec:
        r = self.r
        raw = r.mapping(raw, path, _GPU_KEYS, ("model",))
        name = r.string(raw["model"], join(path, "model"))
        model = catalog().get(name)
        if model is None:
            r.fail(join(path, "model"), f"unknown model '{name}'; known: {', '.join(catalog())}")
        gpu_uuid = r.string(raw.get("uuid", default_uuid(self.hostname, index)), join(path, "uuid"))
        if not gpu_uuid.startswith("GPU-"):
            r.fail(join(path, "uuid"), f"'{gpu_uuid}' must start with 'GPU-'")
        bus = r.string(raw.get("pci_bus_id", default_bus_id(index)), join(path, "pci_bus_id"))
        if not _BUS_ID.match(bus):
            r.fail(join(path, "pci_bus_id"), f"'{bus}' is not like 00000000:18:00.0")
        serial_default = model.serial_prefix + str(
            int.from_bytes(digest(self.hostname, index)[:8], "big") % 10**9
        ).zfill(9)
        serial = r.string(raw.get("serial", serial_default), join(path, "serial"))
        load = self.load(raw.get("load"), join(path, "load"))
        processes = self.processes(raw.get("processes"), join(path, "processes"))
        layout = self.layout(raw.get("mig"), join(path, "mig"), model)
        if layout is not None and processes:
            r.fail(
                join(path, "processes"), "MIG is enabled; list processes under their mig entries"
            )
        used = memory_in_use_mib(load, processes)
        limit = model.memory_mib - model.memory_reserved_mib
        if used > limit:
            r.fail(path, f"{used} MiB in use is more than the {limit} MiB {model.name} has free")
        fabric = fabricspec.for_gpu(
            r,
            model.features.fabric,
            model.name,
            self.fabric,
            raw.get("fabric"),
            join(path, "fabric"),
        )
        ecc = r.boolean(raw.get("ecc", True), join(path, "ecc"))
        if not ecc and not model.features.ecc:
            r.fail(join(path, "ecc"), f"{model.name} has no ECC to turn off; remove 'ecc'")
        return GpuSpec(
            index, model, gpu_uuid, bus.upper(), serial, load, processes, layout, fabric, ecc
        )

    def layout(self, raw: Any, path: str, model: GpuModel) -> tuple[MigSpec, ...] | None:
        r = self.r
        if raw is None or raw is False:
            return None
        if isinstance(raw, tuple) and all(isinstance(e, MigSpec) for e in raw):
            return raw  # already checked (a fault of a loaded fleet, injected again)
        if not model.mig_capable:
            r.fail(path, f"{model.name} has no MIG; remove 'mig'")
        entries = r.sequence(raw, path)
        requests: list[tuple[MigProfile, int | None]] = []
        for i, e in enumerate(entries):
            epath = join(path, i)
            e = r.mapping(e, epath, _MIG_KEYS, ("profile",))
            name = r.string(e["profile"], join(epath, "profile"))
            profile = model.profile(name)
            if profile is None:
                known = ", ".join(p.name for p in model.mig_profiles)
                r.fail(
                    join(epath, "profile"),
                    f"unknown profile '{name}' for {model.name}; known: {known}",
                )
            gi = e.get("gi")
            requests.append(
                (profile, None if gi is None else r.integer(gi, join(epath, "gi"), lo=0))
            )
        try:
            placed = miglayout.place(model, requests)
        except miglayout.LayoutError as err:
            r.fail(path if err.index is None else join(path, err.index), str(err))

        specs = []
        for i, (e, (profile, _), (start, gi)) in enumerate(
            zip(entries, requests, placed, strict=True)
        ):
            epath = join(path, i)
            load = self.load(e.get("load"), join(epath, "load"))
            processes = self.processes(e.get("processes"), join(epath, "processes"))
            used = memory_in_use_mib(load, processes)
            if used > profile.memory_mib:
                r.fail(
                    epath,
                    f"{used} MiB in use is more than the {profile.memory_mib} MiB"
                    f" of {profile.name}",
                )
            index = e.get("index")
            specs.append(
                MigSpec(
                    profile=profile,
                    gi=gi,
                    ci=r.integer(e.get("ci", 0), join(epath, "ci"), lo=0, hi=7),
                    start=start,
                    index=-1
                    if index is None
                    else r.integer(index, join(epath, "index"), lo=0, hi=model.mig_max_devices - 1),
                    uuid=None
                    if e.get("uuid") is None
                    else r.string(e["uuid"], join(epath, "uuid")),
                    load=load,
                    processes=processes,
                )
            )
        return _number_devices(r, path, specs)

    def load(self, raw: Any, path: str) -> LoadSpec:
        r = self.r
        if raw is None:
            return LoadSpec()
        raw = r.mapping(raw, path, _LOAD_KEYS)

        def opt(key: str, lo: float, hi: float | None) -> float | None:
            v = raw.get(key)
            return None if v is None else r.number(v, join(path, key), lo=lo, hi=hi)

        mem = raw.get("mem_used_mib")
        return LoadSpec(
            util=opt("util", 0, 100),
            mem_util=opt("mem_util", 0, 100),
            mem_used_mib=None if mem is None else r.integer(mem, join(path, "mem_used_mib"), lo=0),
            power=opt("power", 0, 1),
            swing=opt("swing", 0, 50),
            period_s=opt("period_s", 1, None) or 120.0,
            enc=opt("enc", 0, 100) or 0.0,
            dec=opt("dec", 0, 100) or 0.0,
        )

    def processes(self, raw: Any, path: str) -> tuple[ProcessSpec, ...]:
        r = self.r
        out: list[ProcessSpec] = []
        pids: set[int] = set()
        for i, p in enumerate(r.sequence(raw, path)):
            ppath = join(path, i)
            p = r.mapping(p, ppath, _PROCESS_KEYS, ("pid",))
            pid = r.integer(p["pid"], join(ppath, "pid"), lo=1, hi=2**32 - 1)
            if pid in pids:
                r.fail(join(ppath, "pid"), f"pid {pid} is listed twice on this device")
            pids.add(pid)
            kind = r.string(p.get("type", "compute"), join(ppath, "type"))
            if kind not in ("compute", "graphics", "mps"):
                r.fail(join(ppath, "type"), f"'{kind}' is not compute, graphics or mps")
            sm = r.number(p.get("sm_util", 0), join(ppath, "sm_util"), lo=0, hi=100)
            start = r.number(p.get("start", 0), join(ppath, "start"), lo=0, hi=None)
            end = p.get("end")
            if end is not None:
                end = r.number(end, join(ppath, "end"), lo=start, hi=None)
            out.append(
                ProcessSpec(
                    pid=pid,
                    used_memory_mib=r.integer(
                        p.get("used_memory_mib", 0), join(ppath, "used_memory_mib"), lo=0
                    ),
                    sm_util=sm,
                    mem_util=r.number(
                        p.get("mem_util", sm * 0.5), join(ppath, "mem_util"), lo=0, hi=100
                    ),
                    type=kind,
                    start=start,
                    end=end,
                )
            )
        return tuple(out)


def _number_devices(r: Reader, path: str, specs: list[MigSpec]) -> tuple[MigSpec, ...]:
    """MIG device indexes: as given, else the free ones in GPU instance id order."""
    taken: dict[int, int] = {}
    for i, s in enumerate(specs):
        if s.index >= 0:
            if s.index in taken:
                r.fail(
                    join(join(path, i), "index"),
                    f"index {s.index} is also entry {taken[s.index]}'s",
                )
            taken[s.index] = i
    free = (n for n in range(64) if n not in taken)
    order = sorted(range(len(specs)), key=lambda i: (specs[i].gi, specs[i].ci))
    out = list(specs)
    for i in order:
        if out[i].index < 0:
            out[i] = replace(out[i], index=next(free))
    return tuple(sorted(out, key=lambda s: s.index))


def coerce(fleet: Fleet | str | Path | Mapping[str, Any] | None) -> Fleet:
    """A Fleet from a Fleet, a fleet file path, a mapping, or None (the default fleet)."""
    if fleet is None:
        return load_fleet(DEFAULT_FLEET)
    if isinstance(fleet, Fleet):
        return fleet
    if isinstance(fleet, Mapping):
        return Fleet.from_dict(dict(fleet))
    return load_fleet(fleet)
