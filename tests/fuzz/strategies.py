"""Shared hypothesis settings and value generators for the property tests.

No example database (nothing is written into the tree) and no deadline (a slow CI
machine must not turn into a flaky test); examples are few enough that each test
takes a second or two.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FAST = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Text a hostile or careless author might write: any Unicode, plus the characters that
# matter to the formats here, often enough that they are not drowned out.
SPECIAL = st.sampled_from(
    [*",\"'#:;=\n\r\t \\/{}[]-*&!|>%@`", "\x00", "\ufeff", "\u2028", "::", "MIG-", "GPU-"]
)
TEXT = st.lists(st.one_of(st.characters(), SPECIAL, st.text(max_size=8)), max_size=40).map("".join)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)


def yaml_like(keys: list[str]) -> st.SearchStrategy[Any]:
    """Nested mappings and lists as YAML gives them, using ``keys`` half of the time."""
    key = st.one_of(st.sampled_from(keys), TEXT, st.integers(), st.none())
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(key, inner, max_size=5),
        ),
        max_leaves=12,
    )
