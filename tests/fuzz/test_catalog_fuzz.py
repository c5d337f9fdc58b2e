"""The metrics-file parser on any text: a Catalog or one CatalogError, nothing else."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.catalog.metricsfile import TYPES, CatalogError, parse
from exporter.catalog.unserved import UNSERVED
from exporter.nvml.fields import FIELDS
from tests.fuzz.strategies import FAST, SPECIAL, TEXT

NAMES = sorted(FIELDS) + sorted(UNSERVED)
NAME = st.one_of(st.sampled_from(NAMES), TEXT)
TYPE = st.one_of(st.sampled_from(TYPES), TEXT)
LINE = st.one_of(
    st.tuples(NAME, TYPE, TEXT).map(lambda r: ", ".join(r)),
    st.lists(st.one_of(NAME, TYPE, TEXT), max_size=5).map(",".join),
    TEXT.map(lambda t: "#" + t),
    st.just(""),
    TEXT,
    SPECIAL,
)


@FAST
@given(st.lists(LINE, max_size=12).map("\n".join))
def test_any_text_loads_or_raises_catalog_error(text):
    try:
        cat = parse(text, "fuzz.csv")
    except CatalogError as e:
        assert str(e).startswith("fuzz.csv:")  # names the file (and line) it is about
        return
    seen = [m.field.name for m in cat.metrics + cat.labels] + [s.name for s in cat.skipped]
    assert len(seen) == len(set(seen))
    assert seen, "a file without rows is an error, not an empty catalog"
    assert all(m.field.name in FIELDS for m in cat.metrics + cat.labels)
    assert all(s.reason for s in cat.skipped)  # every skipped row says why


def _row(name: str, typ: str, help_text: str, pad: str) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow([help_text])  # quoted when it has to be
    return f"{name},{pad}{typ},{pad}{buf.getvalue()}"


VALID = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.just("label") if FIELDS[n].is_label else st.sampled_from(["gauge", "counter"]),
        st.text(
            st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"], blacklist_characters="#"),
            max_size=30,
        ).map(str.strip),
    )
)


@FAST
@given(
    st.lists(VALID, max_size=15, unique_by=lambda r: r[0]),
    st.sampled_from(["", " ", "   "]),
    st.lists(st.sampled_from(["", "# a comment", "  ", "# DCGM_FI_DEV_GPU_TEMP, gauge, off"])),
)
def test_valid_rows_come_back_exactly(rows, pad, noise):
    """Rows written as dcgm-exporter writes them (padding, quoted help with commas,
    comments and blank lines between) parse back to the same names, types and help."""
    lines = [_row(n, t, h, pad) for n, t, h in rows]
    for i, extra in enumerate(noise):
        lines.insert(i % (len(lines) + 1), extra)
    if not rows:
        with pytest.raises(CatalogError, match="has no rows"):
            parse("\n".join(lines))
        return
    cat = parse("\n".join(lines))
    got = [(m.name, m.type, m.help) for m in sorted(cat.metrics + cat.labels, key=lambda m: m.line)]
    assert got == [(n, t, h) for n, t, h in rows]
