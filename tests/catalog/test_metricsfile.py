"""The metrics file parser: dcgm-exporter's format, strict where mistakes lose data."""

from pathlib import Path

import pytest

from exporter.catalog.metricsfile import CatalogError, load, parse
from exporter.config.model import default_metrics_file
from exporter.nvml.fields import FIELDS

FIXTURES = Path(__file__).parent.parent / "fixtures" / "csv"


def test_shipped_metrics_file_serves_every_row():
    cat = load(default_metrics_file())
    assert cat.skipped == ()
    names = [m.name for m in cat.metrics]
    for required in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_EXP_XID_ERRORS_TOTAL",
    ):
        assert required in names
    # read by no alert, rule or panel, and not in dcgm-exporter's default: extended only
    for extended in ("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_PSTATE"):
        assert extended not in names
    assert [m.name for m in cat.labels] == ["DCGM_FI_DRIVER_VERSION"]


def test_extended_metrics_file_serves_every_row():
    cat = load(Path(default_metrics_file()).with_name("metrics-extended.csv"))
    assert cat.skipped == () and cat.duplicates == ()
    names = {m.name for m in cat.metrics}
    assert {"DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_PSTATE", "DCGM_EXP_P2P_STATUS"} <= names


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
        (", gauge, x\n", "m.csv:1: the field name is empty"),
        ("GPU TEMP, gauge, x\n", "m.csv:1: 'GPU TEMP' is not a field name"),
        ("", "m.csv: the metrics file has no rows"),
        ("# only comments\n\n  \n", "m.csv: the metrics file has no rows"),
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


def test_unservable_rows_are_skipped_with_reasons():
    cat = parse(
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
        "DCGM_FI_DEV_FB_USED_RATIO, gauge, a DCGM 4.6 field NVML has no source for\n"
        "DCGM_FI_DEV_NVSWITCH_LINK_STATUS, gauge, switch\n"
        "DCGM_FI_DRIVER_VERSION, gauge, wrong type\n",
        "m.csv",
    )
    assert [m.name for m in cat.metrics] == ["DCGM_FI_DEV_GPU_TEMP"]
    assert [(s.name, s.line) for s in cat.skipped] == [
        ("DCGM_FI_DEV_FB_USED_RATIO", 2),
        ("DCGM_FI_DEV_NVSWITCH_LINK_STATUS", 3),
        ("DCGM_FI_DRIVER_VERSION", 4),
    ]
    name, reason = cat.skipped[0]  # (field name, reason) pairs
    assert name == "DCGM_FI_DEV_FB_USED_RATIO" and "a DCGM field NVML cannot serve" in reason
    assert "NVSwitch" in cat.skipped[1].reason
    assert "list it as label" in cat.skipped[2].reason


@pytest.mark.parametrize(
    ("name", "near"),
    [
        ("DCGM_FI_DEV_GPU_TEMPERATURE", "DCGM_FI_DEV_GPU_TEMP"),
        ("DCGM_FI_DEV_GPU_UTILL", "DCGM_FI_DEV_GPU_UTIL"),
        ("dcgm_gpu_tmp", "dcgm_gpu_temp"),
        ("DCGM_FI_DEV_POWER_USGE", "DCGM_FI_DEV_POWER_USAGE"),
    ],
)
def test_a_name_dcgm_does_not_know_is_refused_with_line_and_suggestion(name, near):
    """dcgm-exporter refuses the file ("could not find DCGM field"); so does this one,
    naming file, line and the nearest name from DCGM's field table."""
    text = f"DCGM_FI_DEV_GPU_TEMP, gauge, t\n# a comment\n{name}, gauge, typo\n"
    with pytest.raises(CatalogError) as e:
        parse(text, "m.csv")
    assert str(e.value).startswith(f"m.csv:3: {name!r} is not a DCGM field")
    assert f"did you mean {near}?" in str(e.value)


def test_a_name_far_from_any_gets_no_suggestion():
    with pytest.raises(CatalogError) as e:
        parse("MY_OWN_COUNTER, gauge, x\n", "m.csv")
    assert "m.csv:1:" in str(e.value) and "did you mean" not in str(e.value)


def test_dcgm_4_6_canonical_names_are_served_as_their_fields():
    """DCGM 4.6's aliases (dcgm_fields.h) share the ID, so the reading, of an older field."""
    cat = parse(
        "DCGM_FI_DEV_BOARD_POWER_RAW_WATTS, gauge, p\n"
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL, gauge, n\n"
        "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS, gauge, s\n",
        "m.csv",
    )
    got = {m.name: m.field for m in cat.metrics}
    for alias, same in (
        ("DCGM_FI_DEV_BOARD_POWER_RAW_WATTS", "DCGM_FI_DEV_POWER_USAGE_INSTANT"),
        ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
        ("DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS", "DCGM_FI_DEV_SLOWDOWN_TEMP"),
    ):
        f, g = got[alias], FIELDS[same]
        assert (f.field_ids, f.call, f.scale, f.rate) == (g.field_ids, g.call, g.scale, g.rate)


def test_every_dcgm_field_name_loads_and_serves_what_nvml_can():
    cat = load(FIXTURES / "dcgm-all-fields.csv")
    served = {m.name for m in cat.metrics + cat.labels}
    rows = [
        ln for ln in (FIXTURES / "dcgm-all-fields.csv").read_text().splitlines() if ln[:1] != "#"
    ]
    assert len(served) + len(cat.skipped) == len(rows) > 600
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_SM_ACTIVE"):
        assert name in served
    assert "DCGM_FI_DEV_NVSWITCH_VOLTAGE_MVOLT" in {s.name for s in cat.skipped}


def test_names_are_served_as_written_with_or_without_old_names():
    """dcgm-exporter serves a row under its first column as written (ExtractCounters:
    ``FieldName = record[0]``); -o renames labels, never metrics."""
    text = (FIXTURES / "dcgm-1x-compatibility-metrics.csv").read_text()
    for old in (False, True):
        cat = parse(text, "1x.csv", old_names=old)
        names = [m.name for m in cat.metrics]
        assert cat.skipped == ()
        for name in ("dcgm_gpu_temp", "dcgm_power_usage", "dcgm_fb_used", "dcgm_gpu_utilization"):
            assert name in names
        fields = {m.field.name for m in cat.metrics}
        assert fields >= {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"}
        cat = parse("DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_fb_used, gauge, f\n", "m", old)
        assert [m.name for m in cat.metrics] == ["DCGM_FI_DEV_GPU_TEMP", "dcgm_fb_used"]


def test_two_names_of_one_field_are_two_families():
    cat = parse("DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_gpu_temp, gauge, t\n", "m")
    assert [(m.name, m.field.name) for m in cat.metrics] == [
        ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP"),
        ("dcgm_gpu_temp", "DCGM_FI_DEV_GPU_TEMP"),
    ]
    assert cat.duplicates == ()


def test_oversized_file_is_refused(tmp_path):
    big = tmp_path / "big.csv"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(CatalogError, match="larger than 1 MiB"):
        load(big)
