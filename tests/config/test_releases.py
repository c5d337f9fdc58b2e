"""--dcgm-exporter-version: one setting for the dcgm-exporter release a node mimics."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.catalog.metricsfile import load
from exporter.cli import build_parser, main
from exporter.config.model import ConfigError
from exporter.config.resolve import config_from
from exporter.config.validate import validate
from tests.support.simnode import node


def cfg(argv: list[str], env: dict[str, str] | None = None):
    return config_from(build_parser().parse_args(argv), env or {})


def test_default_is_4_8_4_with_its_label_and_file():
    c = cfg([])
    assert (c.release.name, c.hostname_label) == ("4.8.4", "hostname")
    assert Path(c.metrics_file).name == "metrics.csv"


@pytest.mark.parametrize(
    ("value", "release", "label", "file", "first_row"),
    [
        ("4.8.2", "4.8.2", "Hostname", "metrics-4.8.2.csv", "DCGM_FI_DEV_SM_CLOCK"),
        ("4.8.4", "4.8.4", "hostname", "metrics.csv", "DCGM_FI_DEV_SM_CLOCK"),
        ("4.9", "4.9", "hostname", "metrics-4.9.csv", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
        ("4.9.0", "4.9", "hostname", "metrics-4.9.csv", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
        ("4.10", "4.10", "hostname", "metrics-4.10.csv", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
        ("4.10.0", "4.10", "hostname", "metrics-4.10.csv", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
    ],
)
def test_each_release_picks_label_and_shipped_file(value, release, label, file, first_row):
    for c in (
        cfg(["--dcgm-exporter-version", value]),
        cfg([], {"GPU_EXPORTER_DCGM_EXPORTER_VERSION": value}),
    ):
        assert (c.release.name, c.hostname_label, Path(c.metrics_file).name) == (
            release,
            label,
            file,
        )
        assert load(c.metrics_file).metrics[0].name == first_row


def test_flag_wins_over_variable_and_hostname_label_over_release():
    env = {"GPU_EXPORTER_DCGM_EXPORTER_VERSION": "4.9"}
    assert cfg(["--dcgm-exporter-version", "4.8.2"], env).release.name == "4.8.2"
    c = cfg(["--hostname-label", "Hostname"], env)
    assert (c.release.name, c.hostname_label) == ("4.9", "Hostname")
    c = cfg(["-f", str(Path(cfg([]).metrics_file))], env)  # a file given keeps its names
    assert Path(c.metrics_file).name == "metrics.csv" and c.release.name == "4.9"


@pytest.mark.parametrize("value", ["4.8", "4.8.3", "4.11", "latest", "5"])
def test_an_unknown_release_is_one_clear_error(value, capsys):
    with pytest.raises(
        ConfigError, match=r"GPU_EXPORTER_DCGM_EXPORTER_VERSION.*use 4\.8\.2, 4\.8\.4, 4\.9, 4\.10"
    ):
        cfg([], {"GPU_EXPORTER_DCGM_EXPORTER_VERSION": value})
    assert main(["--dcgm-exporter-version", value, "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gpu-exporter: error: --dcgm-exporter-version: {value!r} is not a dcgm-exporter "
        "release mimicked; use 4.8.2, 4.8.4, 4.9, 4.10, 4.9.0, 4.10.0"
    ]


def test_4_10_serves_the_pcie_rates_under_their_new_names():
    rows = load(cfg(["--dcgm-exporter-version", "4.10"]).metrics_file)
    names = {m.name for m in rows.metrics}
    assert {
        "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",
        "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND",
    } <= names
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in names


@pytest.mark.parametrize("flag", [["--enable-pprof"], ["--dcgm-log-level", "LOUD"]])
def test_4_8_3_startup_errors_are_warnings_under_4_8_2(flag):
    """4.8.3 made pprof without a web config and an unknown DCGM log level startup errors;
    4.8.2 started with either, and so does a node mimicking it."""
    with pytest.raises(ConfigError):
        cfg(flag)
    c = cfg(["--dcgm-exporter-version", "4.8.2", *flag])
    assert any("accepted, as dcgm-exporter 4.8.2 accepts it" in n for n in c.notices)


@pytest.mark.parametrize(
    ("release", "factor"), [("4.8.2", 1), ("4.8.4", 1), ("4.9", 0.01), ("4.10", 0.01)]
)
def test_gpu_util_ratio_is_dcgm_4_6s_alias_until_4_9_then_a_ratio(tmp_path, release, factor):
    """DCGM 4.6 defines DCGM_FI_DEV_GPU_UTIL_RATIO as field 203, GPU_UTIL's own ID and
    0-100 value (dcgm_fields.h at v4.6.0, lines 775 and 3657); DCGM 4.7, which dcgm-exporter
    4.9 ships, serves it as a 0-1 ratio (exporter/catalog/dcgm-names.csv)."""
    path = tmp_path / "metrics.csv"
    path.write_text("DCGM_FI_DEV_GPU_UTIL, gauge, %\nDCGM_FI_DEV_GPU_UTIL_RATIO, gauge, x\n")
    catalog, problems = validate(cfg(["--dcgm-exporter-version", release, "-f", str(path)]))
    assert catalog is not None and not problems
    with node(catalog=catalog) as n:
        n.cycle()
        snap = n.cycle()
        pairs = [
            (v["DCGM_FI_DEV_GPU_UTIL"], v["DCGM_FI_DEV_GPU_UTIL_RATIO"])
            for v in map(dict, snap.values.values())
            if "DCGM_FI_DEV_GPU_UTIL" in v
        ]
    assert len(pairs) >= 6 and any(util > 1 for util, _ in pairs)
    assert all(ratio == pytest.approx(util * factor) for util, ratio in pairs)
