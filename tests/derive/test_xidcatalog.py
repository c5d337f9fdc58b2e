"""The XID catalog: every published code has a description and a known source."""

from __future__ import annotations

import pytest

from exporter.derive import xidcatalog


def test_every_code_of_the_catalog_is_described():
    rows = xidcatalog.catalog()
    assert sorted(rows) == list(range(173))
    for row in rows.values():
        assert row.description and row.description != xidcatalog.UNKNOWN
        assert len(row.description) <= 100


@pytest.mark.parametrize(
    ("xid", "words", "source"),
    [
        (13, "Graphics engine exception", "application"),
        (31, "page fault", "application"),
        (48, "Double-bit ECC", "memory"),
        (74, "NVLink error", "nvlink"),
        (79, "fallen off the bus", "pcie"),
        (95, "Uncontained ECC", "memory"),
        (119, "GSP", "driver"),
        (150, "NVLink MSE", "nvlink"),
        (172, "SRAM", "memory"),
    ],
)
def test_operators_xids(xid, words, source):
    assert words in xidcatalog.describe(xid)
    assert xidcatalog.source(xid) == source


def test_unknown_code():
    assert xidcatalog.describe(999) == "Unknown XID"


def test_a_bad_row_names_its_line():
    with pytest.raises(ValueError, match="row 2"):
        xidcatalog.parse("xid,description,source\n1,ok,driver\nx,bad,driver\n")
