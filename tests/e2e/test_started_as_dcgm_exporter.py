"""The exporter started as dcgm-exporter users start it: their CSVs and flags, its log."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.procs import Exporter

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def served(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_every_dcgm_field_csv_starts_serves_and_logs_a_dozen_lines():
    exp = Exporter(
        "-f", str(FIXTURES / "dcgm-all-fields.csv"), "-n", "-rbmn", "-r", "localhost:5555"
    )
    try:
        exp.wait_ready()
        text = exp.metrics()
    finally:
        out = exp.stop()
    temps = served(text, "DCGM_FI_DEV_GPU_TEMP")
    # -d f, as dcgm-exporter: 6 whole GPUs, and the 11 MIG instances of the 2 MIG GPUs
    assert len(temps) == 17, text[:2000]
    assert {s.split('gpu="')[1].split('"')[0] for s in temps} == {str(i) for i in range(8)}
    assert all('modelName="NVIDIA-H100' in s and "Hostname" not in s for s in temps), temps[0]
    assert served(text, "DCGM_FI_DEV_POWER_USAGE") and served(text, "DCGM_FI_DEV_FB_USED")
    assert not served(text, "DCGM_FI_DEV_NVSWITCH_VOLTAGE_MVOLT")
    lines = out.splitlines()
    startup = lines[: next(i for i, s in enumerate(lines) if " stopping" in s)]
    assert len(startup) <= 12, "\n".join(startup)
    assert sum(" rows of" in s and "not served" in s for s in startup) == 1
    assert sum("no effect without DCGM: --remote-hostengine-info" in s for s in startup) == 1
    assert "Traceback" not in out


def test_json_log_format_and_old_names(tmp_path: Path):
    csv = tmp_path / "1x.csv"
    csv.write_text((FIXTURES / "dcgm-1x-compatibility-metrics.csv").read_text())
    exp = Exporter("--log-format", "json", "-o", "-c", "300", "-f", str(csv))
    try:
        exp.wait_ready()
        text = exp.metrics()
        csv.write_text(csv.read_text() + "dcgm_power_violation, counter, Throttling (in ns).\n")
        exp.proc.send_signal(signal.SIGHUP)  # a reload keeps the 1.x names
        again = exp.wait_metrics(lambda t: "dcgm_power_violation{" in t, 10, "the new row")
    finally:
        out = exp.stop()
    assert served(text, "dcgm_gpu_temp") and served(text, "dcgm_fb_used")
    assert not served(text, "DCGM_FI_DEV_GPU_TEMP")
    temp = [ln for ln in text.splitlines() if ln.startswith("dcgm_gpu_temp{")]
    assert temp and all('uuid="' in ln and 'UUID="' not in ln for ln in temp)  # -o: labels
    assert served(again, "dcgm_gpu_temp") and not served(again, "DCGM_FI_DEV_GPU_TEMP")
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all({"time", "level", "msg"} <= set(r) for r in records)
    assert any("serving on" in r["msg"] for r in records)
