"""XIDs from the kernel log beside NVML events, as DCGM 4.x reads them: 79, 119 and 120
from /dev/kmsg records (DcgmKmsgReader.cpp), mapped to GPUs by PCI bus id, each XID
counted once whichever way it arrives."""

from __future__ import annotations

import logging
import os

import pynvml

from exporter.nvml.xid import kmsg
from exporter.sim import Fault
from exporter.sim.kmsg import xid_text
from tests.support.simnode import node, until

DEFAULT_BUS_1 = "0000:2a:00"  # GPU 1 of the default fleet: 00000000:2A:00.0


def counts(col) -> dict[tuple[int, int | None, int], int]:
    """{(GPU index, GPU instance, XID): count} of the collector's XID counters."""
    index = {g.uuid: g.index for g in col.enumerator._seen.values()}
    return {(index[u], gi, x): n for u, gi, _ci, x, n in col.xid.state().counts}


def record(path, text: str, seq: int = 1) -> None:
    with open(path, "ab") as f:
        f.write(f"4,{seq},{os.getpid()},-;{text}\n".encode())


def test_xid_79_comes_from_the_kernel_log_with_the_nvml_event_path_silent(tmp_path):
    log = tmp_path / "kmsg"
    with node(kernel_log=str(log)) as n:
        # logged before the exporter started (NVML-REVIEW N7): counted, as DCGM reads
        # /dev/kmsg from its oldest record (DcgmKmsgReader.cpp:197, open without a seek)
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 120, pid=1, name=x, before")
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 13, pid=1, name=x, not from here")
        n.cycle()
        [evset] = n.driver.events.sets.values()
        n.driver.inject(Fault("xid", gpu=1, xid=79))
        n.driver.inject(Fault("xid", gpu=2, xid=119, count=2))
        assert not evset.queue  # NVML never delivered them
        until("the kernel log's XIDs", lambda: len(counts(n.col)) == 3)
        assert counts(n.col) == {(1, None, 120): 1, (1, None, 79): 1, (2, None, 119): 2}
        assert dict(n.cycle().xid.last)[n.driver.gpus[1].uuid] == 79


def test_without_the_kernel_log_xid_79_is_never_counted():
    """What the kernel log is for: NVML events alone never carry XID 79."""
    with node() as n:
        n.cycle()
        n.driver.inject(Fault("xid", gpu=1, xid=79))
        n.driver.inject(Fault("xid", gpu=1, xid=48))  # delivered as an event
        until("XID 48", lambda: (1, None, 48) in counts(n.col))
        assert (1, None, 79) not in counts(n.col)


def test_an_xid_that_arrives_both_ways_counts_once(tmp_path):
    log = tmp_path / "kmsg"
    with node(kernel_log=str(log)) as n:
        n.cycle()
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 79, pid='<unknown>', name=<unknown>, ")
        until("XID 79 from the kernel log", lambda: (1, None, 79) in counts(n.col))
        xid = pynvml.nvmlEventTypeXidCriticalError
        with n.driver.lock:  # a driver that also delivers it as an event
            n.driver.events.publish(n.driver.gpus[1], xid, 79, n.driver.now())
        n.driver.inject(Fault("xid", gpu=1, xid=48))  # an event, and a kernel log line
        until("XID 48, the event after 79's", lambda: (1, None, 48) in counts(n.col))
        n.cycle()
        assert counts(n.col) == {(1, None, 79): 1, (1, None, 48): 1}


def test_nvmls_copy_counts_when_the_kernel_record_is_lost(tmp_path):
    """NVML-REVIEW N8: DCGM records XIDs 79/119/120 from NVML events as well as from
    /dev/kmsg (DcgmCacheManager.cpp, both paths), so one whose kernel record was lost
    (ring overwrite, a cut line) still counts; one both report counts once."""
    log = tmp_path / "kmsg"
    with node(kernel_log=str(log)) as n:
        n.cycle()
        gpu = n.driver.gpus[1]
        event = pynvml.nvmlEventTypeXidCriticalError
        with n.driver.lock:  # the kernel log never got these two
            n.driver.events.publish(gpu, event, 79, n.driver.now())
            n.driver.events.publish(gpu, event, 119, n.driver.now())
        until("NVML's XID 79 and 119", lambda: len(counts(n.col)) == 2)
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 79, pid=1, name=x, the same 79")
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 79, pid=1, name=x, a second", seq=2)
        n.driver.inject(Fault("xid", gpu=1, xid=48))  # an event after the lines: all read
        until("XID 48", lambda: (1, None, 48) in counts(n.col))
        until("the second 79", lambda: counts(n.col)[(1, None, 79)] == 2)
        n.cycle()
        assert counts(n.col) == {(1, None, 79): 2, (1, None, 119): 1, (1, None, 48): 1}


def test_other_records_and_malformed_ones_are_skipped(tmp_path):
    log = tmp_path / "kmsg"
    with node(kernel_log=str(log)) as n:
        n.cycle()
        record(log, "usb 1-1: new high-speed USB device number 2 using xhci_hcd")
        record(log, "NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=x, no such GPU here")
        record(log, "NVRM: Xid (PCI:0000:2a:00): seventy-nine, pid=1")
        record(log, "NVRM: Xid (PCI:0000:2a:00): 79, " + "x" * 5_000)  # too long, one read
        # too long over many reads; no part of it is a line of its own
        record(log, "x" * 100_000 + " NVRM: Xid (PCI:0000:2a:00): 119, tail")
        with open(log, "ab") as f:
            f.write(os.urandom(4096).replace(b"\n", b" ") + b"\n")
        record(log, f"NVRM: Xid (PCI:{DEFAULT_BUS_1}): 120, pid=7, name=python3, GSP error")
        until("XID 120", lambda: (1, None, 120) in counts(n.col))
        assert counts(n.col) == {(1, None, 120): 1}


def test_an_unreadable_kernel_log_leaves_the_codes_to_nvml_events(tmp_path, caplog):
    missing = tmp_path / "no" / "kmsg"
    with caplog.at_level(logging.WARNING), node(kernel_log=str(missing), sim_log=False) as n:
        n.cycle()
        with n.driver.lock:
            n.driver.events.publish(n.driver.gpus[1], pynvml.nvmlEventTypeXidCriticalError, 79, 0)
        until("XID 79 from NVML", lambda: (1, None, 79) in counts(n.col))
        n.cycle()
    lines = [r.getMessage() for r in caplog.records if str(missing) in r.getMessage()]
    assert len(lines) == 1 and "NVML events" in lines[0]


def test_the_rest_of_a_line_too_long_is_not_read_as_a_line():
    """A line over MAX_LINE is dropped up to its end, however the reads cut it."""
    got: list = []
    lines = kmsg._Lines(kmsg.KernelLog("/dev/null", lambda bus, xid: got.append(xid)))
    lines.feed(b"4,1,1,-;" + b"x" * (kmsg.MAX_LINE + 10))
    lines.feed(b"NVRM: Xid (PCI:0000:2a:00): 119, tail\n")
    lines.feed(b"4,2,2,-;NVRM: Xid (PCI:0000:2a:00): 120, pid=1, next line\n")
    assert got == [120]


def _follow(path) -> tuple[kmsg.KernelLog, list]:
    got: list = []
    reader = kmsg.KernelLog(str(path), lambda bus, xid: got.append(xid))
    assert reader.start() == ""
    return reader, got


def _xids(path, n: int, xid: int, mode: str = "ab") -> None:
    with open(path, mode) as f:
        for i in range(n):
            f.write(f"4,{i},1,-;NVRM: Xid (PCI:{DEFAULT_BUS_1}): {xid}, pid={i}, n\n".encode())


def test_a_kernel_log_file_truncated_and_rewritten_is_read_again(tmp_path):
    """A logger's file truncated, then rewritten (longer than before, or shorter): every
    XID written after the reader started is counted, 30 of 30."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"")
    reader, got = _follow(path)
    try:
        _xids(path, 10, 79)
        until("the first ten", lambda: len(got) == 10)
        _xids(path, 15, 119, "wb")  # truncated and rewritten past the old end
        until("the rewrite", lambda: len(got) == 25)
        _xids(path, 5, 120, "wb")  # truncated and rewritten shorter
        until("the short rewrite", lambda: len(got) == 30)
        assert got == [79] * 10 + [119] * 15 + [120] * 5
    finally:
        reader.stop()


def test_a_rotated_kernel_log_file_is_followed_to_the_new_one(tmp_path):
    """logrotate's rename and create: the old file's last lines, then the new file's."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"")
    reader, got = _follow(path)
    try:
        _xids(path, 3, 79)
        until("the first", lambda: len(got) == 3)
        os.rename(path, tmp_path / "kern.log.1")
        _xids(tmp_path / "kern.log.1", 2, 79)  # written before the logger reopened
        _xids(path, 4, 120)  # the new file
        until("both", lambda: len(got) == 9)
        _xids(path, 1, 119)
        until("the new file's next line", lambda: len(got) == 10)
        assert got == [79] * 5 + [120] * 4 + [119]
    finally:
        reader.stop()


def test_every_form_the_open_driver_prints_is_read():
    """NVML-REVIEW N6: kernel_rc.c prints an XID on a MIG instance with its instance ids
    (XID_PRINT_WITH_ATTR); each form is the GPU's XID, and a malformed one is not."""
    lines = [
        b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, fallen off",
        b"NVRM: Xid (PCI:0000:3b:00 GPU-I:02): 79, pid=1, name=x, fallen off",
        b"NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:00): 79, pid=1, name=x, fallen off",
    ]
    assert [kmsg.parse(line) for line in lines] == [((0, 0x3B, 0), 79)] * 3
    for bad in (
        b"NVRM: Xid (PCI:0000:3b:00 GPU-I:): 79, x",
        b"NVRM: Xid (PCI:0000:3b:00 GPU-CI:00): 79, x",
        b"NVRM: Xid (PCI:0000:3b:00 GPU-I:02 junk): 79, x",
    ):
        assert kmsg.parse(bad) is None, bad


def test_the_simulator_writes_each_form_the_reader_reads():
    for gi, ci in ((None, None), (3, None), (3, 1)):
        text = xid_text("00000000:3B:00.0", 13, "Graphics Exception", gi=gi, ci=ci)
        assert ("GPU-I:03" in text) is (gi is not None)
        assert kmsg.parse(text.encode()) == ((0, 0x3B, 0), 13)
