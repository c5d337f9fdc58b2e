"""The metrics file parser: dcgm-exporter's format, strict where mistakes lose data."""

from pathlib import Path

import pytest

from exporter.catalog import CatalogError, load, parse
from exporter.config import default_metrics_file

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def test_shipped_metrics_file_serves_every_row():
    cat = load(default_metrics_file())
    assert cat.skipped == ()
    names = [m.name for m in cat.metrics]
    for required in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PSTATE",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_EXP_XID_ERRORS_TOTAL",
    ):
        assert required in names
    assert [m.name for m in cat.labels] == ["DCGM_FI_DRIVER_VERSION"]


def test_repo_root_metrics_csv_is_the_shipped_one():
    root = Path(__file__).parents[2] / "metrics.csv"
    assert root.read_text() == Path(default_metrics_file()).read_text()


def test_dcgm_default_counters_load_unchanged():
    cat = load(FIXTURES / "dcgm-default-counters.csv")
    served = {m.name for m in cat.metrics}
    assert "DCGM_FI_DEV_DEC_UTIL" in served  # written "DCGM_FI_DEV_DEC_UTIL ," there
    assert "DCGM_FI_PROF_PCIE_RX_BYTES" in served
    assert [(s.name, s.line) for s in cat.skipped] == [("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 64)]
    assert "not available through NVML" in cat.skipped[0].reason
    assert [m.name for m in cat.labels] == ["DCGM_FI_DRIVER_VERSION"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DCGM_FI_DEV_GPU_UTIL, gauge\n", "m.csv:1: expected 3 comma-separated fields"),
        ("# c\nDCGM_FI_DEV_GPU_UTIL, gauge, a, b\n", "m.csv:2: expected 3 comma-separated fields"),
        ("DCGM_FI_DEV_GPU_UTIL, gauges, x\n", "m.csv:1: DCGM_FI_DEV_GPU_UTIL: unknown metric type"),
        ("DCGM_FI_DEV_GPU_UTILL, gauge, x\n", "m.csv:1: unknown field 'DCGM_FI_DEV_GPU_UTILL'"),
        (", gauge, x\n", "m.csv:1: the field name is empty"),
        ("DCGM_FI_DRIVER_VERSION, gauge, x\n", "m.csv:1: DCGM_FI_DRIVER_VERSION is a label field"),
        ("DCGM_FI_DEV_GPU_TEMP, label, x\n", "m.csv:1: DCGM_FI_DEV_GPU_TEMP is a gauge or counter"),
        (
            "DCGM_FI_DEV_GPU_TEMP, gauge, a\n\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n",
            "m.csv:3: DCGM_FI_DEV_GPU_TEMP is already listed on line 1",
        ),
        ('DCGM_FI_DEV_GPU_TEMP, gauge, "unclosed\n', "m.csv:"),
    ],
)
def test_malformed_rows_name_file_and_line(text, message):
    with pytest.raises(CatalogError) as e:
        parse(text, "m.csv")
    assert str(e.value).startswith(message)


def test_comments_blank_lines_quotes_and_padding():
    cat = parse(
        '  # indented comment\n\n   DCGM_FI_DEV_GPU_TEMP ,  gauge ,  "Temp, in C."\n',
        "m.csv",
    )
    assert [(m.name, m.type, m.help, m.line) for m in cat.metrics] == [
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "Temp, in C.", 3)
    ]


def test_histogram_rows_are_skipped_with_reason():
    cat = parse("DCGM_FI_DEV_GPU_TEMP, histogram, x\n", "m.csv")
    assert cat.metrics == ()
    assert "histogram" in cat.skipped[0].reason


def test_unreadable_file(tmp_path):
    with pytest.raises(CatalogError, match=r"metrics file .*cannot read it"):
        load(tmp_path / "missing.csv")
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"DCGM_FI_DEV_GPU_TEMP, gauge, \xe9\n")
    with pytest.raises(CatalogError, match="not UTF-8"):
        load(bad)
