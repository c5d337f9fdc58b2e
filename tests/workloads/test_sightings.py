"""Holders' start and end times from the kubelet's answers and the API server's times."""

from __future__ import annotations

import random

from exporter.frame import Owner, Window
from exporter.workloads.sightings import MAX_KEPT, SIGHT_S, Sightings

POD = Owner("ns", "p", "c")


def _one(_key: str, _owner: Owner) -> float:
    return 1.0


def test_a_holder_starts_and_ends_midway_between_the_answers_around_it() -> None:
    s = Sightings()
    s.see({}, _one, 100.0)
    s.see({"gpu0": (POD,)}, _one, 105.0)
    assert s.take() == {("gpu0", "ns", "p", "c"): Window(102.5, None)}
    s.see({"gpu0": (POD,)}, _one, 110.0)
    assert s.take() == {}  # nothing began or stopped
    s.see({}, _one, 115.0)
    assert s.take() == {("gpu0", "ns", "p", "c"): Window(None, 112.5)}


def test_a_holder_listed_in_the_first_answer_has_no_known_start() -> None:
    s = Sightings()
    s.see({"gpu0": (POD,)}, _one, 100.0)
    assert s.take() == {("gpu0", "ns", "p", "c"): Window(None, None)}


def test_the_api_servers_times_replace_the_estimates() -> None:
    s = Sightings(lambda owner: (101.0, 108.0) if owner == POD else (None, None))
    s.see({}, _one, 100.0)
    s.see({"gpu0": (POD,)}, _one, 105.0)
    s.see({}, _one, 110.0)  # began and ended between two cycles: one window, its share
    assert s.take() == {("gpu0", "ns", "p", "c"): Window(101.0, 108.0)}


def test_without_the_api_each_start_and_end_is_within_half_a_sighting_interval() -> None:
    """Random pods over a grid of answers every SIGHT_S: the measured error of each start
    and end, and of each pod's time (docs/accounting.md quotes these)."""
    rnd = random.Random(36)
    pods = []
    for i in range(300):
        start = rnd.uniform(10, 1000)
        pods.append((Owner("ns", f"p{i}", "c"), start, start + rnd.uniform(SIGHT_S, 120)))
    s = Sightings()
    got: dict[str, list[float | None]] = {}
    t = 0.0
    while t < 1200:
        live = tuple(o for o, a, b in pods if a <= t < b)
        s.see({"gpu0": live}, _one, t)
        for key, w in s.take().items():
            now = got.setdefault(key[2], [None, None])
            now[0] = w.start if w.start is not None else now[0]
            now[1] = w.end if w.end is not None else now[1]
        t += SIGHT_S
    errors = []
    for o, a, b in pods:
        start, end = got[o.pod]
        assert start is not None and end is not None
        assert abs(start - a) <= SIGHT_S / 2 and abs(end - b) <= SIGHT_S / 2
        errors.append((end - start) - (b - a))
    assert max(abs(e) for e in errors) <= SIGHT_S
    assert abs(sum(errors) / len(errors)) < 0.25  # none on average


def test_the_holders_kept_are_bounded() -> None:
    s = Sightings()
    s.see({}, _one, 0.0)
    many = tuple(Owner("ns", f"p{i}", "c") for i in range(MAX_KEPT + 10))
    s.see({"gpu0": many}, _one, 5.0)
    assert len(s.take()) == MAX_KEPT
