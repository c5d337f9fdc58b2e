"""NVIDIA's own metrics files (dcgm-exporter 4.8.2, copied unchanged): each loads,
every row is served or named as not served, and ``--check`` passes on it."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest

from exporter import cli
from exporter.catalog.metricsfile import load, parse
from exporter.config import validate
from exporter.config.model import Config

NVIDIA = Path(__file__).parent.parent / "fixtures" / "csv" / "nvidia-4.8.2"
FILES = ("default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv")


def rows(path: Path) -> list[tuple[int, str]]:
    """(line, first column) of every row that is not a comment: what dcgm-exporter reads."""
    out = []
    with path.open() as f:
        reader = csv.reader(f, skipinitialspace=True)
        for row in reader:
            if row and "".join(row).strip() and not row[0].lstrip().startswith("#"):
                out.append((reader.line_num, row[0].strip()))
    return out


@pytest.mark.parametrize("name", FILES)
def test_every_row_is_served_or_named(name, capsys, monkeypatch):
    path = NVIDIA / name
    cat = load(path)
    served = {m.line: m for m in cat.metrics + cat.labels}
    skipped = {s.line: s for s in cat.skipped}
    replaced = {earlier for _, earlier, _ in cat.duplicates}
    for line, field in rows(path):
        assert line in served or line in skipped or line in replaced, (name, line, field)
    monkeypatch.setattr(validate, "address_problem", lambda *_: None)  # port 9400 may be taken
    assert cli.main(["--check", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    for s in cat.skipped:  # --check names each row not served, with the reason
        assert s.name in out and s.reason[:40] in out


def test_vgpu_license_row_is_named_in_the_startup_warning(caplog):
    cat = load(NVIDIA / "default-counters.csv")
    assert [s.name for s in cat.skipped] == ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
    with caplog.at_level(logging.INFO, logger="exporter"):
        validate.log_startup(Config(), cat)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in warnings[0]


def test_nvidia_1x_csv_with_rows_listed_twice_starts_with_one_warning(caplog):
    path = NVIDIA / "1.x-compatibility-metrics.csv"
    cat = load(path, old_names=True)
    # NVIDIA lists the two PCIe rows on lines 18/19 and again on 65/66
    assert cat.duplicates == (
        ("dcgm_fi_prof_pcie_tx_bytes", 18, 65),
        ("dcgm_fi_prof_pcie_rx_bytes", 19, 66),
    )
    names = [m.name for m in cat.metrics]
    assert len(names) == len(set(names))  # one family each
    tx = next(m for m in cat.metrics if m.field.name == "DCGM_FI_PROF_PCIE_TX_BYTES")
    assert tx.line == 65 and tx.help.startswith("The number of bytes of active pcie tx")
    assert names.index("dcgm_fi_prof_pcie_tx_bytes") < names.index("dcgm_pcie_replay_counter")
    with caplog.at_level(logging.INFO, logger="exporter"):
        validate.log_startup(Config(), cat)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "dcgm_fi_prof_pcie_tx_bytes (lines 18 and 65)" in warnings[0]
    assert "dcgm_fi_prof_pcie_rx_bytes (lines 19 and 66)" in warnings[0]


def test_later_row_wins_type_and_help():
    cat = parse(
        "DCGM_FI_DEV_GPU_TEMP, gauge, first\nDCGM_FI_DEV_FB_USED, gauge, fb\n"
        "DCGM_FI_DEV_GPU_TEMP, counter, second\n",
        "m.csv",
    )
    assert [(m.name, m.type, m.help, m.line) for m in cat.metrics] == [
        ("DCGM_FI_DEV_GPU_TEMP", "counter", "second", 3),
        ("DCGM_FI_DEV_FB_USED", "gauge", "fb", 2),
    ]
    assert cat.duplicates == (("DCGM_FI_DEV_GPU_TEMP", 1, 3),)
