"""How much of a collection cycle's CPU was the simulated driver, and how much the exporter.

The simulated driver is Python. Each call costs (a) its modelled cost, CPU
burnt (with the GIL released, as ctypes does) for what the real driver call
costs, and (b) the simulator's own bookkeeping, which a real
``libnvidia-ml.so`` does not do. Wrapping every function of the installed
``SimLibrary`` with a thread-CPU clock, and the modelled wait itself
(``latency.spin``), separates the three parts of a cycle:

- *own*: CPU outside the simulated library: the exporter, pynvml, rendering;
- *sim*: the simulator's bookkeeping (library CPU less the modelled waits);
- *modelled*: the latency model's cost of the calls made.

*net* = own + modelled is what the cycle would cost on a real node with the
published call costs. It does not depend on how much CPU the modelled waits
got: they wait on the wall clock, so on a busy machine a preempted wait burns
less CPU than it models, and a measured total reads low.

Works in any process that installed the simulation: the gpu-exporter
benchmarks and the nvitop-exporter runner (``peer_cycle.py``) alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from exporter.sim import library

# Blocking waits are idle time, not CPU: left unwrapped.
_SKIP = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})
BATCH = 10


@dataclass
class Account:
    """Running totals over every wrapped call (seconds and counts)."""

    cpu_s: float = 0.0  # thread CPU inside the simulated library, modelled waits included
    spin_s: float = 0.0  # thread CPU in the modelled waits
    modelled_s: float = 0.0  # what the latency model says the calls cost
    calls: Counter[str] = field(default_factory=Counter)
    modelled_by_function: Counter[str] = field(default_factory=Counter)

    @property
    def overhead_s(self) -> float:
        """CPU the simulator spent on its own bookkeeping (not present on a real node)."""
        return self.cpu_s - self.spin_s

    def copy(self) -> Account:
        return Account(
            self.cpu_s,
            self.spin_s,
            self.modelled_s,
            Counter(self.calls),
            Counter(self.modelled_by_function),
        )

    def since(self, earlier: Account) -> Account:
        """The calls made after `earlier` was copied."""
        calls = Counter(self.calls)
        calls.subtract(earlier.calls)
        by_fn = Counter(self.modelled_by_function)
        by_fn.subtract(earlier.modelled_by_function)
        return Account(
            self.cpu_s - earlier.cpu_s,
            self.spin_s - earlier.spin_s,
            self.modelled_s - earlier.modelled_s,
            +calls,
            +by_fn,
        )


def instrument(driver: Any) -> Account:
    """Wrap the installed simulated library's functions; returns the live totals."""
    acct = Account()
    lib = driver.library
    spec = driver.latency
    per_field_s = spec.per_field_us / 1e6 if spec.enabled else 0.0
    for name, fn in list(vars(lib).items()):
        if not name.startswith("nvml") or not callable(fn) or name in _SKIP:
            continue
        cost = spec.cost_s(name)
        wrapped = _wrap(acct, name, fn, cost, per_field_s if name.endswith("FieldValues") else 0.0)
        setattr(lib, name, wrapped)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    spin = library.spin
    clock = time.thread_time

    def counted_spin(seconds: float) -> None:
        t0 = clock()
        spin(seconds)
        acct.spin_s += clock() - t0

    library.spin = counted_spin  # looked up by the library's call wrappers at each call
    return acct


def _wrap(
    acct: Account, name: str, fn: Callable[..., Any], cost: float, per_field: float
) -> Callable[..., Any]:
    clock = time.thread_time

    def call(*args: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args)
        finally:
            acct.cpu_s += clock() - t0
            modelled = cost
            if per_field:
                modelled += per_field * _count(args)
            acct.modelled_s += modelled
            acct.calls[name] += 1
            acct.modelled_by_function[name] += modelled

    call.__name__ = name
    return call


def _count(args: tuple[Any, ...]) -> int:
    try:
        n = args[1]
        return int(getattr(n, "value", n))
    except (IndexError, TypeError, ValueError):
        return 0


def wrapper_cost_s(samples: int = 20000) -> float:
    """CPU one wrapped call adds outside the library (the clock reads), to take off *own*."""
    acct = Account()
    noop = _wrap(acct, "noop", lambda *a: 0, 0.0, 0.0)
    bare: Callable[..., Any] = lambda *a: 0  # noqa: E731
    t0 = time.thread_time()
    for _ in range(samples):
        bare(1)
    t1 = time.thread_time()
    for _ in range(samples):
        noop(1)
    t2 = time.thread_time()
    inside = acct.cpu_s
    return max(0.0, ((t2 - t1) - (t1 - t0) - inside) / samples)


def batch_sizes(cycles: int) -> list[int]:
    """Cycles split into batches of BATCH (one batch when there are fewer than two)."""
    if cycles < 2 * BATCH:
        return [cycles]
    return [BATCH] * (cycles // BATCH)


Cycle = Callable[[], tuple[float, float, float]]


def measure(one: Cycle, driver: Any, cycles: int) -> dict[str, Any]:
    """Two passes of `cycles` cycles in batches; milliseconds per cycle.

    `one()` runs a cycle and returns (collect CPU s, collect wall s, publish CPU s).
    The first pass, uninstrumented, gives *measured* CPU and wall time (the batch
    with the lowest mean: other work on the machine only ever adds to it). The
    second instruments the simulated library and splits a cycle into own, sim and
    modelled; its batch is the one with the least own CPU, which, unlike the total,
    does not read low when modelled waits are preempted.
    """
    plain = []
    for size in batch_sizes(cycles):
        runs = [one() for _ in range(size)]
        plain.append(
            (
                sum(r[0] + r[2] for r in runs) / size,
                sum(r[1] for r in runs) / size,
                sum(r[0] for r in runs) / size,
                sum(r[2] for r in runs) / size,
            )
        )
    measured = min(plain)
    acct = instrument(driver)
    one()
    per_call = wrapper_cost_s()
    batches = []
    for size in batch_sizes(cycles):
        before = acct.copy()
        runs = [one() for _ in range(size)]
        used = acct.since(before)
        collect = sum(r[0] for r in runs) / size
        publish = sum(r[2] for r in runs) / size
        calls = sum(used.calls.values()) / size
        own = collect - used.cpu_s / size - calls * per_call + publish
        batches.append(
            {
                "own_ms": own * 1e3,
                "own_publish_ms": publish * 1e3,
                "sim_overhead_ms": used.overhead_s / size * 1e3,
                "spin_cpu_ms": used.spin_s / size * 1e3,
                "modelled_driver_ms": used.modelled_s / size * 1e3,
                "net_ms": (own + used.modelled_s / size) * 1e3,
                "nvml_calls": calls,
                "modelled_by_function_ms": {
                    k: v / size * 1e3 for k, v in used.modelled_by_function.most_common(6)
                },
            }
        )
    best = min(batches, key=lambda b: b["own_ms"])
    return {
        "cycle_cpu_ms": measured[0] * 1e3,
        "collect_wall_ms": measured[1] * 1e3,
        "collect_cpu_ms": measured[2] * 1e3,
        "publish_cpu_ms": measured[3] * 1e3,
        **best,
        "batches": len(batches),
        "cycle_cpu_batches_ms": [round(b[0] * 1e3, 3) for b in plain],
        "net_batches_ms": [round(b["net_ms"], 3) for b in batches],
        "wrapper_cost_us": per_call * 1e6,
    }


def cycles_main(
    measure: Callable[[str, int, int], dict[str, Any]],
    prog: str,
    doc: str,
    cycles: int,
    warmup: int,
    argv: list[str] | None = None,
) -> int:
    """The command line of a cycle benchmark (``FLEET [--cycles N] [--warmup N]``, these
    the defaults): ``measure(fleet, cycles, warmup)`` printed as one JSON line."""
    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument("fleet", help="fleet YAML file")
    p.add_argument("--cycles", type=int, default=cycles)
    p.add_argument("--warmup", type=int, default=warmup)
    args = p.parse_args(argv)
    json.dump(measure(args.fleet, args.cycles, args.warmup), sys.stdout)
    print()
    return 0
