"""The device check's probes (tools/devicecheck/nvmlprobes.py) run through on the simulated driver:
each answers, none raises, and the answers are the simulator's beliefs that a real GPU
is to confirm."""

from __future__ import annotations

import pynvml

from exporter import sim
from tools.devicecheck.nvmlprobes import PROBES, run_all


def test_every_probe_answers_on_the_simulated_driver():
    sim.install(None, latency=False)  # real time: the probes sleep between samples
    try:
        pynvml.nvmlInit()
        answers = run_all(pynvml, pynvml.nvmlDeviceGetHandleByIndex(1))
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()
    assert set(answers) == {p.name for p in PROBES}
    assert [name for name, a in answers.items() if "error" in a] == []
    assert answers["process_lists"]["entry_bytes"] == 24
    assert [pid for pid, *_ in answers["process_lists"]["Compute"]] == [41101, 41102, 41103]
    assert answers["field_values"]["197"]["return"] == pynvml.NVML_SUCCESS
    assert answers["memory_and_identity"]["total_eq_reserved_used_free"]
