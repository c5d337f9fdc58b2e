"""The eviction rule (exporter/http/eviction.py) on connections described by their state."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from exporter.http.eviction import victim


@dataclass(eq=False)
class Conn:
    name: str
    answered_at: float | None = None
    busy: bool = False
    going: bool = False
    stalled: bool = False


def pick(*conns: Conn) -> str | None:
    chosen = victim(conns)
    return chosen.name if chosen is not None else None


def test_never_answered_go_first_oldest_first():
    assert pick(Conn("scraper", 5.0), Conn("a"), Conn("b")) == "a"
    assert pick(Conn("a", going=True), Conn("b"), Conn("c")) == "b"


def test_a_first_request_being_answered_goes_after_the_silent_ones():
    assert pick(Conn("first", busy=True), Conn("scraper", 5.0), Conn("silent")) == "silent"
    assert pick(Conn("scraper", 5.0), Conn("first", busy=True)) == "first"


def test_an_answered_client_that_stopped_reading_goes_before_the_scraper():
    deaf = Conn("deaf", 1.0, busy=True, stalled=True)
    assert pick(deaf, Conn("scraper", 0.5)) == "deaf"
    assert pick(Conn("first", busy=True), deaf, Conn("silent")) == "silent"
    assert pick(Conn("first", busy=True), deaf) == "first"


def test_among_answered_the_longest_idle_goes_then_the_busy_ones():
    assert pick(Conn("x", 3.0), Conn("y", 1.0), Conn("z", 2.0)) == "y"
    assert pick(Conn("x", 1.0, busy=True), Conn("y", 4.0)) == "y"
    assert pick(Conn("x", 2.0, busy=True), Conn("y", 1.0, busy=True)) == "y"


def test_none_when_every_one_is_already_going():
    assert pick(Conn("a", going=True), Conn("b", 1.0, going=True)) is None
    assert pick() is None


conns = st.lists(
    st.builds(
        Conn,
        name=st.text(max_size=3),
        answered_at=st.one_of(st.none(), st.floats(0, 100)),
        busy=st.booleans(),
        going=st.booleans(),
        stalled=st.booleans(),
    ),
    max_size=12,
)


@given(conns)
def test_an_answered_reading_connection_goes_only_when_no_other_can(pool):
    chosen = victim(pool)
    staying = [c for c in pool if not c.going]
    if not staying:
        assert chosen is None
        return
    assert chosen is not None and not chosen.going
    untrusted = [c for c in staying if c.answered_at is None or c.stalled]
    if untrusted:
        idle = [c for c in untrusted if not c.busy and not c.stalled]
        assert chosen is (idle or untrusted)[0]  # oldest first
    else:
        idle = [c for c in staying if not c.busy]
        assert chosen.answered_at == min(c.answered_at for c in (idle or staying))
