"""A collection read at its own interval (--config-file): how often each field is really
read, and what the faster collection costs in CPU.

    python -m benchmarks.groups [--seconds 61] [--interval 30] [--every 5]   (prints JSON)

Runs the exporter's own poller and collector in this process on the simulated driver
(default fleet: 8x H100, two with MIG, latency model on), in real time, twice: with
the shipped metrics file alone, and with a collection that reads DCGM_FI_DEV_GPU_TEMP
and DCGM_FI_DEV_POWER_USAGE every ``--every`` seconds while the cycle runs every
``--interval`` seconds. NVML calls are counted in the simulator (benchmarks/accounting.py):
GPU_TEMP is nvmlDeviceGetTemperatureV, POWER_USAGE nvmlDeviceGetPowerUsage, and the
SM and memory clocks (read by the cycle only) nvmlDeviceGetClockInfo. CPU is this
process's (every thread) over the run; publish is the render of the exposition after
a cycle and after a group read (median, ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

from benchmarks.accounting import instrument
from benchmarks.simnode import SimNode
from exporter.config.model import Collection

FIELDS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE")


async def run(seconds: float, interval_s: float, every_s: float | None) -> dict[str, Any]:
    collections = (Collection("fast", every_s, FIELDS),) if every_s else ()
    node = SimNode(
        None,
        manual=False,
        collections=collections,
        interval_s=interval_s,
        timeout_s=min(interval_s, 10.0),
    )
    poller = node.poller
    calls = instrument(node.driver).calls
    took: dict[bool, list[float]] = {False: [], True: []}
    publish = poller.publish

    def timed(snap: Any, group: bool = False) -> None:
        t0 = time.perf_counter()
        publish(snap, group)
        took[group].append(time.perf_counter() - t0)

    poller.publish = timed  # type: ignore[method-assign]
    cpu0, wall0 = time.process_time(), time.monotonic()
    task = asyncio.create_task(poller.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    node.close(1.0)
    gpus = 8
    return {
        "collection": f"{FIELDS} every {every_s} s" if every_s else "none",
        "cycles": poller.selfmetrics.collections["success"],  # every cycle succeeds here
        "reads_per_gpu": {
            "GPU_TEMP": calls["nvmlDeviceGetTemperatureV"] / gpus,
            "POWER_USAGE": calls["nvmlDeviceGetPowerUsage"] / gpus,
            "SM_CLOCK+MEM_CLOCK": calls["nvmlDeviceGetClockInfo"] / gpus / 2,
        },
        "cpu_ms_per_s": round(1000 * cpu / wall, 2),
        "publish_ms_median": {"cycle": _median_ms(took[False]), "group": _median_ms(took[True])},
        "wall_s": round(wall, 1),
    }


def _median_ms(xs: list[float]) -> float | None:
    return round(1000 * sorted(xs)[len(xs) // 2], 2) if xs else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=61.0)
    p.add_argument("--interval", type=float, default=30.0)
    p.add_argument("--every", type=float, default=5.0)
    a = p.parse_args()
    out = [
        asyncio.run(run(a.seconds, a.interval, None)),
        asyncio.run(run(a.seconds, a.interval, a.every)),
    ]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
