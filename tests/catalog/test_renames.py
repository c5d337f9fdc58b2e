"""exporter/catalog/dcgm-names.csv, the one table of dcgm-exporter 4.9's renames: the fields the
exporter serves under the new names read the old ones' readings in the new units, and
docs/compatibility.md shows the table and the releases as they are."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from exporter import sim
from exporter.catalog.metricsfile import parse
from exporter.catalog.renames import parse as parse_table
from exporter.catalog.renames import renames
from exporter.collector import Collector
from exporter.config.releases import RELEASES
from exporter.nvml.fields import FIELDS

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")


def test_every_rename_is_served_under_both_names_in_its_units() -> None:
    for r in renames():
        old, new = FIELDS[r.old], FIELDS[r.new]
        assert (old.scope, old.source) == (new.scope, new.source), r.new


@pytest.mark.parametrize(
    ("factor", "status", "why"),
    [("1", "maybe", "status"), ("1e3", "confirmed", "not a number"),
     ("0.000", "confirmed", "above 0"), ("-2", "confirmed", "above 0")],
)  # fmt: skip
def test_the_table_refuses_a_malformed_row(factor: str, status: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"t\.csv:3.*{why}"):
        parse_table(
            f"old, new, u, u, f, status, since\n\nA, B, C, C, {factor}, {status}, 4.9\n", "t.csv"
        )


def test_factors_are_kept_exactly() -> None:
    head = "old, new, u, u, factor, status, since\n"
    kib, ms = parse_table(
        head + "A, B, KiB, B, 1024.000, confirmed, 4.9\nC, D, ms, s, 0.001, confirmed, 4.10\n"
    )
    assert (kib.since, ms.since) == ("4.9", "4.10")
    assert (kib.num, kib.den, kib.scale) == (1024, 1, 1024.0)
    assert (ms.factor, ms.scale) == (Fraction(1, 1000), 0.001)


def test_new_names_read_the_old_readings_times_the_factor() -> None:
    """One cycle on the simulated node, every field under both names: the same reading
    (the framebuffer in bytes is NVML's count, rounded down to MiB under the old names;
    field 449's old value is rounded down to a whole 1000 KiB/s)."""
    rows = [
        f"{n}, {'label' if FIELDS[n].is_label else 'gauge'}, x"
        for r in renames()
        for n in (r.old, r.new)
    ]
    catalog = parse("\n".join(rows), dcgm47=True)  # the new names as 4.9 serves them
    clock = sim.ManualClock()
    sim.install(None, clock=clock)
    collector = Collector(catalog, "node", clock=lambda: 1_700_000_000 + clock())
    try:
        collector.collect()  # a first sample of the rates
        clock.advance(1.0)
        snap = collector.collect()
    finally:
        collector.close()
        sim.uninstall()
    compared, read = set(), set()
    for values in snap.values.values():
        for r in renames():
            if r.old in values:
                read.add(r.new)
                assert r.new in values, r.new
                old, new = Fraction(values[r.old]), Fraction(values[r.new])
                # in the old unit, within the old name's rounding down to a whole number
                assert -1e-6 <= new / r.factor - old < 1, r.new
                compared.add(r.new)
    assert len(compared) >= 20


def _section(title: str) -> str:
    return DOC.split(title, 1)[1].split("\n#", 1)[0]


def test_the_compatibility_doc_shows_the_renames_table_as_it_is() -> None:
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in _section("### Names and units per release").splitlines()
        if line.startswith("| DCGM_")
    ]
    table = [
        [
            r.old,
            r.old_unit,
            r.new,
            r.unit,
            str(r.factor),
            "confirmed" if r.confirmed else "unconfirmed",
            r.since,
        ]
        for r in renames()
    ]
    assert rows == table


def test_the_compatibility_doc_shows_what_each_release_picks() -> None:
    section = _section("## dcgm-exporter releases: 4.8.2, 4.8.4, 4.9 and 4.10")
    cells = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| |")
    }
    releases = list(RELEASES.values())
    assert cells["node label"] == [f"`{r.hostname_label}`" for r in releases]
    assert cells["`GPU_CI_ID` on MIG series"] == ["yes" if r.ci_label else "no" for r in releases]
    detail = "`health_error_severity`, `health_error_category` on the health status"
    assert cells[detail] == ["yes" if r.health_detail else "no" for r in releases]
    shipped = [f"`exporter/catalog/{r.metrics_file}`" for r in releases]
    assert cells["shipped metrics file"] == shipped
    strict = cells["`--enable-pprof` without `--web-config-file`, an unknown `--dcgm-log-level`"]
    assert strict == ["an error" if r.strict_flags else "a warning" for r in releases]


def test_the_shipped_files_differ_only_as_the_releases_do() -> None:
    """4.9's file is 4.8.4's under the DCGM 4.7 names, plus FB_CAPACITY_BYTES; 4.8.2's has
    4.8.4's rows, the DCGM_EXP_* rows and field 449 typed counter."""

    def rows(name: str) -> dict[str, str]:
        text = (ROOT / "exporter" / "catalog" / name).read_text(encoding="utf-8")
        found = re.findall(r"^#? ?(DCGM_\w+),\s*(\w+),", text, re.M)
        return dict(found)

    now, old, new = rows("metrics.csv"), rows("metrics-4.8.2.csv"), rows("metrics-4.9.csv")
    counter = {n for n in now if n.startswith("DCGM_EXP_") and not n.endswith("_TOTAL")}
    counter.add("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
    assert {
        n: "counter" if n in counter else t
        for n, t in now.items()
        if n != "DCGM_EXP_CLOCK_EVENTS_TOTAL"
    } == old
    renamed = {r.old: r.new for r in renames() if r.since == "4.9"}
    assert {renamed.get(n, n): t for n, t in now.items()} | {
        "DCGM_FI_DEV_FB_CAPACITY_BYTES": "gauge"
    } == new
    # 4.10's file: 4.9's with the four 4.10 renames
    later = {r.old: r.new for r in renames() if r.since == "4.10"}
    assert {later.get(n, n): t for n, t in new.items()} == rows("metrics-4.10.csv")
    assert set(later.values()) & set(rows("metrics-4.10.csv"))
