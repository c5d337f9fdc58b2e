"""derive/accounting/statefile.py and durable.py: the counters on disk, written atomically,
taken back only on the same boot, driver and GPUs; any bad file is one line and a fresh
start."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from exporter.derive.accounting import durable
from exporter.derive.accounting.statefile import MAX_BYTES, NAME, StateFile, Unusable
from exporter.derive.stage import Derive
from exporter.frame import Claim, DeviceUse
from tests.derive.accounting.test_ledger import ENERGY, gpu, served, snap


@pytest.fixture
def boot(tmp_path: Path) -> Path:
    p = tmp_path / "boot_id"
    p.write_text("1b2c3d4e-0000-4000-8000-000000000001\n")
    return p


def derive(directory: Path, boot: Path) -> Derive:
    class Cfg:
        accounting_state_dir = str(directory)

    d = Derive(Cfg())
    assert d.state is not None
    d.state.boot_id_path = str(boot)
    return d


def cycles(d: Derive, g, *times: float) -> None:
    uses = {g.key: DeviceUse((Claim("ml", "train", "c"),))}
    for t in times:
        values = {g.key: {ENERGY: t * 100_000}}  # 100 W
        d.ledger.update(snap(t, [g], values=values), uses)
        if d._ident is None:
            d._restore(snap(t, [g]), "580.95.05")


def test_a_restart_carries_on_and_counts_the_time_it_was_down(tmp_path, boot) -> None:
    g = gpu()
    old = derive(tmp_path, boot)
    cycles(old, g, 0, 30, 60)
    old.save()
    new = derive(tmp_path, boot)
    new._restore(snap(100, [g]), "580.95.05")
    cycles(new, g, 100, 130)
    got = served(new.ledger)
    assert got[("allocated_gpu_seconds_total", "train")] == 60 + 30
    acc = new.ledger.accounts({}, [])
    assert acc.gpus[0].down == (40, 4000)  # 60 s to 100 s, at 100 W
    assert not list(tmp_path.glob(".accounting-state-*"))  # no temporary file left


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("boot", "the node rebooted"),
        ("driver", "the driver changed"),
        ("gpus", "the GPUs changed"),
    ],
)
def test_another_boot_driver_or_gpu_set_is_ignored_in_one_line(
    tmp_path, boot, caplog, change, why
) -> None:
    g = gpu()
    old = derive(tmp_path, boot)
    cycles(old, g, 0, 30)
    old.save()
    if change == "boot":
        boot.write_text("another\n")
    new = derive(tmp_path, boot)
    gpus = [g, gpu(1)] if change == "gpus" else [g]
    driver = "590.1" if change == "driver" else "580.95.05"
    with caplog.at_level(logging.WARNING):
        new._restore(snap(100, gpus), driver)
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()]
    assert len(caplog.records) == 1 and new.ledger.holders == {}


HOSTILE = {
    "not json": b'{"version": 1, ',
    "truncated": None,  # a real file cut in half
    "empty": b"",
    "not utf-8": b"\xff\xfe\x00",
    "wrong version": json.dumps({"version": 99}).encode(),
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "NaN": None,
    "negative": None,
    "wrong shape": None,
    "huge string": None,
}


def _hostile(kind: str, good: dict) -> bytes:
    raw = HOSTILE[kind]
    if raw is not None:
        return raw
    state = json.loads(json.dumps(good))
    if kind == "truncated":
        return json.dumps(good).encode()[: len(json.dumps(good)) // 2]
    if kind == "NaN":
        state["holders"][0][5] = float("nan")
        return json.dumps(state).encode()  # Python writes NaN; the reader refuses it
    if kind == "negative":
        state["gpus"][0][2] = -5
    if kind == "wrong shape":
        state["holders"][0] = {"allocated": 1}
    if kind == "huge string":
        state["holders"][0][2] = "x" * 5000
    return json.dumps(state).encode()


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_bad_file_is_one_line_and_a_fresh_start(tmp_path, boot, caplog, kind) -> None:
    g = gpu()
    old = derive(tmp_path, boot)
    cycles(old, g, 0, 30)
    old.save()
    good = json.loads((tmp_path / NAME).read_text())
    (tmp_path / NAME).write_bytes(_hostile(kind, good))
    new = derive(tmp_path, boot)
    with caplog.at_level(logging.WARNING):
        cycles(new, g, 100, 130)  # restores at its first cycle, then counts on
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    assert "counters start from 0" in caplog.records[0].getMessage()
    assert served(new.ledger)[("allocated_gpu_seconds_total", "train")] == 30


def test_oversized_or_not_a_regular_file(tmp_path, boot, caplog) -> None:
    g = gpu()
    target = tmp_path / "elsewhere"
    target.write_text("{}")
    (tmp_path / NAME).symlink_to(target)
    d = derive(tmp_path, boot)
    with caplog.at_level(logging.WARNING):
        d._restore(snap(0, [g]), "580.95.05")
    (tmp_path / NAME).unlink()
    os.mkfifo(tmp_path / NAME)  # a reader that blocked here would hang the exporter
    d = derive(tmp_path, boot)
    with caplog.at_level(logging.WARNING):
        d._restore(snap(0, [g]), "580.95.05")
    (tmp_path / NAME).unlink()
    with open(tmp_path / NAME, "wb") as f:
        f.truncate(MAX_BYTES + 1)
    d = derive(tmp_path, boot)
    with caplog.at_level(logging.WARNING):
        d._restore(snap(0, [g]), "580.95.05")
    assert len(caplog.records) == 3
    assert "larger than" in caplog.records[2].getMessage()


def test_a_directory_that_cannot_be_written_is_logged_once(tmp_path, boot, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    d = derive(blocker / "state", boot)  # a path under a regular file
    cycles(d, gpu(), 0, 30)  # its restore logs that it cannot read there
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        d.save()
        d.save()
    assert len(caplog.records) == 1 and "not written" in caplog.records[0].getMessage()


def test_restore_takes_nothing_back_from_a_file_of_the_wrong_shape(tmp_path, boot) -> None:
    old = derive(tmp_path, boot)
    cycles(old, gpu(), 0, 30)
    body = durable.dump(old.ledger, old.clock_totals, old.xids)
    body["gpus"][0] = ["too short"]
    fresh = derive(tmp_path, boot)
    with pytest.raises(Unusable):
        durable.restore(body, fresh.ledger, fresh.clock_totals, fresh.xids)
    assert fresh.ledger.holders == {} and fresh.ledger.gpus == {}
    assert StateFile(str(tmp_path)).path.name == NAME


@pytest.mark.parametrize("dra", [(), ("claim", "ml", "gpu.nvidia.com", "node-a", "gpu-0")])
def test_xid_totals_carry_on_with_the_pod_they_were_charged_to(tmp_path, boot, dra) -> None:
    """Two XID 79 on GPU 0 while ml/train held it (through a DRA claim, or not), one XID 13
    on GPU 1; the new process's event thread counts from 0 again, and one more XID 79
    comes: 3."""
    from dataclasses import replace

    from exporter.frame import Holder, Owner
    from exporter.nvml.xid.events import XidState

    g0, g1 = gpu(0), gpu(1)
    train = Holder(Owner("ml", "train", "c", *dra), "uid-1", (("label_team", "a"),))
    old = derive(tmp_path, boot)
    old._restore(snap(0, [g0, g1]), "580.95.05")
    seen = replace(snap(0, [g0, g1]), xid=XidState(((g0.uuid, None, None, 79, 2),)))
    old.xids.update(seen, {g0.key: train})
    seen = replace(snap(1, [g0, g1]), xid=XidState(((g1.uuid, None, None, 13, 1),)))
    old.xids.update(seen, {g0.key: train})
    old.save()
    new = derive(tmp_path, boot)
    new._restore(snap(100, [g0, g1]), "580.95.05")
    seen = replace(snap(100, [g0, g1]), xid=XidState(((g0.uuid, None, None, 79, 1),)))
    got = new.xids.update(seen, {g0.key: train})
    assert [(s.device.key, s.xid, s.holder, s.count) for s in got] == [
        (g0.key, 79, train, 3),
        (g1.key, 13, None, 1),
    ]


def test_down_time_adds_up_over_restarts_and_a_clock_set_back_adds_none(tmp_path, boot) -> None:
    """Down from 60 to 100 and from 130 to 150 (at 100 W); then a process whose clock went
    back to before the last one's last cycle (180): no down time, none taken away; then
    one whose first cycle read no energy: down time, no energy."""
    g = gpu()
    first = derive(tmp_path, boot)
    cycles(first, g, 0, 30, 60)
    first.save()
    for t0, down in ((100, 40), (150, 60), (170, 60)):
        later = derive(tmp_path, boot)
        later._restore(snap(t0, [g]), "580.95.05")
        cycles(later, g, t0, t0 + 30)
        later.save()
        assert later.ledger.accounts({}, []).gpus[0].down == (down, down * 100), t0
    unread = derive(tmp_path, boot)  # its first cycle could not read the energy counter
    unread._restore(snap(220, [g]), "580.95.05")
    unread.ledger.update(snap(220, [g]), {g.key: DeviceUse((Claim("ml", "train", "c"),))})
    assert unread.ledger.accounts({}, []).gpus[0].down == (80, 6000)
