"""One collection cycle of nvitop-exporter on the simulated driver, in its own venv.

    benchmarks/.venv-peer/bin/python -m benchmarks.peer_cycle FLEET.yaml --cycles 10

Builds nvitop-exporter's ``PrometheusExporter`` over the same devices its CLI
finds (physical GPUs, then their MIG devices) and runs the body of its
``collect()`` loop: ``update_host()`` then ``update_device()`` per device.
That loop only sets prometheus-client gauges; nvitop-exporter renders the
text on every scrape, which the process benchmark measures separately. Prints
one JSON object, measured like ``benchmarks.cycle`` (same clock, same
accounting: benchmarks/accounting.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks.accounting import cycles_main
from benchmarks.accounting import measure as measure_batches
from exporter import sim


def measure(fleet: str, cycles: int, warmup: int) -> dict[str, Any]:
    clock = sim.ManualClock()
    driver = sim.install(fleet, clock=clock)

    from nvitop import Device
    from nvitop_exporter.exporter import PrometheusExporter
    from prometheus_client import generate_latest

    physical = Device.from_indices(range(Device.count()))
    devices = list(physical)
    for d in physical:
        devices.extend(d.mig_devices())
    exporter = PrometheusExporter(devices, hostname="bench-node", interval=1.0)

    def one() -> tuple[float, float, float]:
        clock.advance(1.0)
        c0, w0 = time.process_time(), time.perf_counter()
        exporter.update_host()
        for d in devices:
            exporter.update_device(d)
        return time.process_time() - c0, time.perf_counter() - w0, 0.0

    for _ in range(warmup):
        one()
    result = measure_batches(one, driver, cycles)

    renders = []
    for _ in range(5):  # what one scrape renders; the least of five, as for cycles
        c0 = time.process_time()
        text = generate_latest(exporter.registry)
        renders.append(time.process_time() - c0)
    render_cpu = min(renders)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    result.update(
        {
            "devices": len(devices),
            "cycles": cycles,
            "render_cpu_ms": render_cpu * 1e3,
            "series": series,
            "plain_bytes": len(text),
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    return cycles_main(measure, "python -m benchmarks.peer_cycle", __doc__, 10, 2, argv)


if __name__ == "__main__":
    sys.exit(main())
