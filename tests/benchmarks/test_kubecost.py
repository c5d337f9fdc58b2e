"""benchmarks.kubecost: the per-thread CPU of an exporter with and without pods, in short."""

import json
import subprocess
import sys

from benchmarks.procs import ROOT


def test_kubecost_reports_each_thread_group_with_and_without_pods():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.kubecost",
            "exporter/sim/fleets/default.yaml",
            "--pods",
            "12",
            "--interval-ms",
            "200",
            "--window",
            "1",
            "--settle",
            "0.5",
            "--calls",
            "20",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(r.stdout)
    plain, pods = out["processes"]
    assert not plain["k"] and pods["k"]
    # the kubelet client runs on the event loop: no thread of its own, with -k or without
    assert "native" not in plain["ms_per_cycle"] and "native" not in pods["ms_per_cycle"]
    assert pods["ms_per_cycle"]["main"] > 0
    assert plain["attributed_series"] == 0 < pods["attributed_series"]
    assert out["refresh_call"]["calls"] == 20 and out["refresh_call"]["attributed_devices"] > 0
