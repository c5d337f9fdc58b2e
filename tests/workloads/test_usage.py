"""workloads/usage.py: which processes belong to the holders of a device, which are unaccounted,
and whose process lists a cycle reads; the join's visibility through a host /proc."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from exporter.config.model import KubeConfig
from exporter.frame import Owner
from exporter.nvml.devices import Device
from exporter.nvml.processes import ProcUse
from exporter.snapshot import Snapshot
from exporter.workloads.attribution import Attribution
from exporter.workloads.mapper import PodMap
from exporter.workloads.usage import Usage, device_uses, wants_processes

A = Owner("ml", "a", "c")
B = Owner("ml", "b", "c")
OTHER = Owner("ml", "other", "c")  # a running container that holds none of these devices
MIB = 1 << 20


def dev(key: str) -> Device:
    return Device(key, 0, key, "NVIDIA H100 80GB HBM3", None, (("UUID", key),))


def snap(processes: dict[str, tuple[ProcUse, ...]], *keys: str) -> Snapshot:
    return Snapshot(
        0.0, 0.0, entities=tuple(dev(k) for k in keys), processes=MappingProxyType(processes)
    )


def podmap(owners: dict, replicas: dict | None = None) -> PodMap:
    return PodMap(MappingProxyType(owners), MappingProxyType(replicas or {}))


# host PID -> (known, owner): 1xx belong to a, 2xx to b, 3xx run in no pod, 4xx in a pod
# the API server no longer knows, 5xx in OTHER, 9xx cannot be placed (not visible)
def whose(pid: int) -> tuple[bool, Owner | None]:
    return {1: (True, A), 2: (True, B), 3: (True, None), 4: (True, None), 5: (True, OTHER)}.get(
        pid // 100, (False, None)
    )


def test_every_process_on_a_device_no_one_holds_is_unaccounted() -> None:
    rows = (ProcUse(301, 1024.0, 5.0), ProcUse(901, 512.0, 0.0))
    use = device_uses(snap({"G": rows}, "G"), podmap({}), whose)["G"]
    assert use.claims == () and use.unaccounted_processes == 2
    assert use.unaccounted_bytes == 1536 * MIB
    # not read (no memory in use): nothing known, nothing unaccounted
    use = device_uses(snap({}, "G"), podmap({}), None)["G"]
    assert use.claims == () and use.unaccounted_processes == 0


def test_on_a_mig_instance_no_one_holds_without_process_memory_all_its_use_counts() -> None:
    """NVML withholds per-process memory on MIG from an unprivileged reader: a leftover on
    an instance no pod holds is its memory in use, not 0 bytes."""
    rows = (ProcUse(301, None, None),)
    s = Snapshot(
        0.0,
        0.0,
        entities=(dev("M"),),
        values=MappingProxyType({"M": MappingProxyType({"DCGM_FI_DEV_FB_USED": 5000.0})}),
        processes=MappingProxyType({"M": rows}),
    )
    use = device_uses(s, podmap({}), whose)["M"]
    assert (use.unaccounted_bytes, use.unaccounted_processes) == (5000 * MIB, 1)
    use = Usage().uses(s, podmap({}), whose)["M"]
    assert use.unaccounted_bytes == 5000 * MIB
    # memory in use not read: the processes are counted, their bytes are not known
    use = device_uses(snap({"M": rows}, "M"), podmap({}), whose)["M"]
    assert (use.unaccounted_bytes, use.unaccounted_processes) == (0, 1)


def test_on_a_held_device_strays_are_the_processes_the_join_places_elsewhere() -> None:
    rows = tuple(
        ProcUse(pid, 1000.0, 10.0) for pid in (101, 301, 401, 501, 901)
    )  # a's, no pod, deleted pod, another container, not visible
    use = device_uses(snap({"G": rows}, "G"), podmap({"G": (A,)}), whose)["G"]
    (claim,) = use.claims
    assert (claim.pod, claim.share, claim.running) == ("a", 1.0, True)
    assert claim.sm_percent is None  # a sole holder's activity is the device's
    assert use.unaccounted_processes == 3 and use.unaccounted_bytes == 3000 * MIB


def test_a_sole_holder_that_runs_nothing_is_known_to_run_nothing() -> None:
    rows = (ProcUse(301, 4000.0, 0.0),)  # only a process in no pod
    use = device_uses(snap({"G": rows}, "G"), podmap({"G": (A,)}), whose)["G"]
    assert use.claims[0].running is False and use.unaccounted_processes == 1


def test_where_no_process_can_be_placed_nothing_is_said_per_holder() -> None:
    rows = (ProcUse(901, 4000.0, 20.0), ProcUse(902, 10.0, 5.0))
    use = device_uses(snap({"G": rows}, "G"), podmap({"G": (A, B)}), whose)["G"]
    assert [(c.running, c.sm_percent) for c in use.claims] == [(None, None), (None, None)]
    assert use.unaccounted_processes == 0


def test_a_shared_device_gets_each_holders_sm_and_replicas() -> None:
    rows = (ProcUse(101, 100.0, 30.0), ProcUse(102, 100.0, 5.0), ProcUse(301, 100.0, 10.0))
    pm = podmap({"G": (A, B)}, {"G": {A: ("0",), B: ("1", "2")}})
    use = device_uses(snap({"G": rows}, "G"), pm, whose)["G"]
    a, b = use.claims
    assert (a.share, a.sm_percent, a.running) == (1 / 3, 35.0, True)
    assert (b.share, b.sm_percent, b.running) == (2 / 3, 0.0, False)
    assert use.unattributed_sm_percent == 10.0 and use.unaccounted_processes == 1
    assert (use.replicas, use.basis) == (3, "held")  # nothing advertised known


def test_shares_are_replicas_held_over_replicas_advertised() -> None:
    """A lone holder of one replica of four holds a quarter of the GPU; when the List
    names a replica the advertised ones lack (an answer older than the plugin's new
    config), the shares fall back to the replicas held, and say so."""
    four = frozenset({"0", "1", "2", "3"})
    pm = podmap({"G": (A,)}, {"G": {A: ("0",)}})
    use = device_uses(snap({}, "G"), pm, None, {"G": four})["G"]
    assert [c.share for c in use.claims] == [0.25]
    assert (use.replicas, use.basis) == (4, "advertised")
    pm = podmap({"G": (A, B)}, {"G": {A: ("0",), B: ("1", "2")}})
    use = device_uses(snap({}, "G"), pm, None, {"G": four})["G"]
    assert [c.share for c in use.claims] == [0.25, 0.5]
    pm = podmap({"G": (A, B)}, {"G": {A: ("0",), B: ("7",)}})
    use = device_uses(snap({}, "G"), pm, None, {"G": four})["G"]
    assert [c.share for c in use.claims] == [0.5, 0.5]
    assert (use.replicas, use.basis) == (2, "held")
    # a whole GPU, with or without replicas advertised elsewhere: one holder, all of it
    use = device_uses(snap({}, "G"), podmap({"G": (A,)}), None, {"H": four})["G"]
    assert [c.share for c in use.claims] == [1.0] and (use.replicas, use.basis) == (0, "")


def test_without_a_join_a_shared_device_has_shares_only() -> None:
    rows = (ProcUse(101, 100.0, 30.0),)
    use = device_uses(snap({"G": rows}, "G"), podmap({"G": (A, B)}), None)["G"]
    assert [(c.share, c.sm_percent, c.running) for c in use.claims] == [
        (0.5, None, None),
        (0.5, None, None),
    ]
    assert use.unaccounted_processes == 0


def test_which_devices_processes_are_read() -> None:
    pm = podmap({"S": (A, B), "H": (A,)})
    no_join, join = wants_processes(pm, False), wants_processes(pm, True)
    used, idle, unknown = {"DCGM_FI_DEV_FB_USED": 1200.0}, {"DCGM_FI_DEV_FB_USED": 0.0}, {}
    assert no_join("S", idle) and join("S", idle)  # shared: always
    assert not no_join("H", used) and join("H", used)  # held by one: only with the join
    assert no_join("F", used) and not no_join("F", idle)  # free: when memory is in use
    assert no_join("F", unknown)  # or when its memory was not read


def test_a_device_not_read_keeps_its_use_while_its_holders_stay() -> None:
    usage = Usage()
    first = usage.uses(snap({}, "H"), podmap({"H": (A,)}), None)["H"]
    assert usage.uses(snap({}, "H"), podmap({"H": (A,)}), None)["H"] is first  # a new answer
    assert usage.uses(snap({}, "H"), podmap({"H": (B,)}), None)["H"] is not first


def test_the_join_tells_a_process_in_no_pod_from_one_it_cannot_see(tmp_path: Path) -> None:
    """With hostPID, a host service's /proc entry is visible and names no pod: it is
    outside Kubernetes. Without it, the PID's entry is absent: nothing is known."""
    (tmp_path / "301").mkdir()
    (tmp_path / "301" / "cgroup").write_text("0::/system.slice/render.service\n")
    attribution = Attribution(
        KubeConfig("node", str(tmp_path / "none.sock"), host_proc=str(tmp_path))
    )
    assert attribution._whose(301) == (True, None)
    assert attribution._whose(901) == (False, None)


def test_with_the_join_held_devices_are_read_a_lot_per_cycle_in_turn() -> None:
    keys = [f"H{i:02d}" for i in range(10)]  # HELD_PER_CYCLE 4: lots of 4, 4 and 2
    pm = podmap({k: (Owner("ns", k, "c"),) for k in keys})
    used = {"DCGM_FI_DEV_FB_USED": 100.0}
    lots = [[k for k in keys if wants_processes(pm, True, turn)(k, used)] for turn in range(4)]
    assert [len(lot) for lot in lots] == [4, 4, 2, 4]
    assert sorted(lots[0] + lots[1] + lots[2]) == keys and lots[3] == lots[0]


def test_a_held_device_keeps_what_its_last_read_found_until_its_holder_changes() -> None:
    """Read in one cycle of three, a leftover stays unaccounted in between, not flapping."""
    pm = podmap({"H": (A,)})
    usage = Usage()
    rows = (ProcUse(401, 2048.0, 0.0),)  # a deleted pod's process
    seen = [usage.uses(snap({"H": rows}, "H"), pm, whose)["H"].unaccounted_processes]
    seen += [usage.uses(snap({}, "H"), pm, whose)["H"].unaccounted_processes for _ in range(2)]
    assert seen == [1, 1, 1]
    other = podmap({"H": (B,)})  # a new holder: what was read for the old one no longer holds
    assert usage.uses(snap({}, "H"), other, whose)["H"].unaccounted_processes == 0


def test_while_the_kubelets_answer_is_not_current_nothing_is_unaccounted() -> None:
    """Before the first answer, or while the kubelet fails, a device missing from the map
    may well be held: its processes are neither read nor called unaccounted."""
    pm = podmap({"H": (A,)})
    used = {"DCGM_FI_DEV_FB_USED": 100.0}
    assert not wants_processes(pm, False, trusted=False)("F", used)
    rows = (ProcUse(401, 2048.0, 0.0),)
    got = Usage().uses(snap({"F": rows, "H": rows}, "F", "H"), pm, whose, trusted=False)
    assert got["F"].unaccounted_processes == 0 and got["H"].unaccounted_processes == 0
    assert [c.pod for c in got["H"].claims] == ["a"]
