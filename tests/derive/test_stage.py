"""The derive stage: it alone advances the state across cycles, once per cycle.

A group read (a collection at its own interval) hands the cycle's values again; a
render that fails loses no derived state; rendering a frame advances nothing.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from exporter.derive.accounting.plan import UTIL
from exporter.derive.stage import Derive
from exporter.exposition.build import Builder
from exporter.exposition.selfmetrics import SelfMetrics
from exporter.poller import Poller
from exporter.snapshot import Snapshot
from tests.exposition.test_build import gpu, snap
from tests.support.catalogs import ALL_ROWS as CATALOG  # the windows are not in the default
from tests.support.exposition import find

BUSY = "gpu_exporter_busy_gpu_seconds_total"


def at(t: float, util: float, xids: int) -> Snapshot:
    """GPU 0 at unix time ``t`` (s), ``util`` percent busy, ``xids`` XID 13s so far."""
    g = gpu(0)
    s = snap([g], values={g.key: {UTIL: util}}, counts=[(g.uuid, None, None, 13, xids)])
    return dataclasses.replace(s, taken_at=t)


def window(frame) -> dict:
    return {(k, x): n for k, x, n in frame.derived.xid_window.series}


def test_a_group_read_hands_the_cycles_values_again_and_advances_nothing():
    d = Derive()
    first = d.cycle(at(0, 0, 1), CATALOG)
    group = d.again(at(5, 100, 3))
    assert group.xids == first.xids and group.derived is first.derived
    assert group.accounts is first.accounts
    assert group.snap.values[gpu(0).key][UTIL] == 100  # the group's newer readings
    after = d.cycle(at(10, 100, 3), CATALOG)
    # 0-10 s is charged with what the cycle at 0 s saw (idle): the group read at 5 s
    # started no interval of its own
    (holder,) = after.accounts.holders
    assert (holder.allocated, holder.busy) == (10.0, 0.0)
    assert [s.count for s in after.xids] == [3]
    assert window(after) == {(gpu(0).key, "13"): 3}


def test_rendering_a_frame_advances_nothing():
    d, b = Derive(), Builder(SelfMetrics(1.0))
    frame = d.cycle(at(0, 50, 1), CATALOG)
    b.render(frame, CATALOG)
    once = b.dcgm_text + b.accounting_part.decode()
    b.render(frame, CATALOG)
    assert b.dcgm_text + b.accounting_part.decode() == once
    assert d.cycle(at(10, 50, 1), CATALOG).accounts.holders[0].allocated == 10.0


class _Session(SimpleNamespace):
    up = True
    driver_version = nvml_version = ""

    def error_counts(self) -> tuple:
        return ()


async def test_derived_state_survives_a_render_that_fails(monkeypatch):
    """The derive stage runs before the render: a cycle whose render raises still counts
    its XIDs and charges its interval, so the next exposition carries on from it (when
    rendering advanced the ledger, the failed cycle's interval was charged with the
    weights of the cycle before)."""
    poller = Poller(CATALOG, SimpleNamespace(session=_Session()), 1.0, 10.0)
    try:
        poller.publish(at(0, 0, 1))
        good = poller.builder.render

        def bad(*args, **kwargs):
            raise ValueError("a value nobody planned for")

        monkeypatch.setattr(poller.builder, "render", bad)
        with pytest.raises(ValueError):
            poller.publish(at(10, 100, 2))
        monkeypatch.setattr(poller.builder, "render", good)
        poller.publish(at(20, 100, 2))
        text = poller.exposition.plain.decode()
        assert [s.value for s in find(text, BUSY)] == [10.0]  # 10-20 s at 100 %
        assert [s.value for s in find(text, "DCGM_EXP_XID_ERRORS_TOTAL")] == [2.0]
        assert [s.value for s in find(text, "DCGM_EXP_XID_ERRORS_COUNT")] == [2.0]  # both in
    finally:
        poller.close()
