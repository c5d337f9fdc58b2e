"""The exporter's XID health grading against DCGM's C++ (NVML-REVIEW N1): for XIDs 0-172,
every release mimicked grades as the DCGM it ships, read from tests/fixtures/dcgm by
tests/support/dcgmtable.py, not from the exporter's table."""

from __future__ import annotations

from importlib import resources

import pytest

from exporter.config.releases import RELEASES
from exporter.derive import dcgmxids
from exporter.derive.health import PASS, HealthInputs, gpu_health, grade, xid_incident
from tests.support import dcgmtable

# dcgm-exporter release -> the DCGM tag it ships (its release notes and tags: 4.5.3-4.8.2)
SHIPS = {"4.8.2": "v4.5.3", "4.8.4": "v4.6.0", "4.9": "v4.6.0", "4.10": "v4.6.0"}


def expected(tag: str, xid: int, volta: bool) -> tuple[str, int, str] | None:
    row = dcgmtable.table(tag).get(xid)
    if row is None or (row[3] == "VOLTA" and not volta):
        return None
    return row[0], row[1], row[2]


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("volta", [False, True])
def test_every_xid_is_graded_as_dcgm_does(release, volta):
    dcgm = RELEASES[release].dcgm
    tag = SHIPS[release]
    assert tag == f"v{dcgm}"
    got = {x: xid_incident(x, dcgm, volta) for x in range(173)}
    want = {x: expected(tag, x, volta) for x in range(173)}
    assert {x: g for x, g in got.items() if g != want[x]} == {}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_one_xid_raises_its_watch_only_with_a_graded_code(release):
    dcgm = RELEASES[release].dcgm
    for xid, (watch, result, code, _) in dcgmtable.table(SHIPS[release]).items():
        series = {s.watch: s for s in gpu_health(HealthInputs({xid: 1}, volta=True), dcgm)}
        assert (series[watch].value, series[watch].error_code) == (result, code), xid
        assert {s.value for w, s in series.items() if w != watch} == {PASS}, xid
        if RELEASES[release].health_detail:  # the severity labels of 4.8.3 and later
            assert grade(code)[0] != "UNKNOWN", code


def test_the_table_names_the_commits_it_was_read_from():
    text = (resources.files("exporter.derive") / "dcgm-xids.csv").read_text()
    for tag in ("v4.5.3", "v4.6.0"):
        assert f"tag {tag} (commit" in text.replace("\n# ", " ")
        assert dcgmtable.commit(tag) in text.replace("\n# ", "")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("4.6.0,x,ALL,FAIL,DCGM_FR_XID_ERROR,", "data row 1: expected"),
        ("4.6.0,79,ALL,BAD,DCGM_FR_XID_ERROR,", "data row 1: expected"),
        ("4.6.0,79,ALL,FAIL,DCGM_FR_XID_ERROR,AMPERE", "data row 1: expected"),
        ("4.6.0,79,ALL,FAIL,A,\n4.6.0,79,ALL,FAIL,B,", "data row 2: XID 79 listed twice"),
    ],
)
def test_a_bad_row_is_named(row, message):
    with pytest.raises(ValueError, match=message):
        dcgmxids.parse("dcgm,xid,watch,result,code,arch\n" + row)
