"""workloads/attribution.py against a real gRPC kubelet on a unix socket (the fake kubelet):
how long its last answer is charged for once it stops answering, what is trusted
meanwhile, and which devices get a holder of their own."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporter.config.model import KubeConfig
from exporter.nvml.devices import Device
from exporter.nvml.processes import ProcUse
from exporter.snapshot import Snapshot
from exporter.workloads.attribution import STALE_S, Attribution

T0 = 1.8e9  # the collector's unix seconds at the first cycle
FB_USED = "DCGM_FI_DEV_FB_USED"
# a GPU no pod holds, with memory in use and a process on it
LOOSE = Device("LOOSE", 9, "GPU-loose", "NVIDIA H100 80GB HBM3", None, (("UUID", "GPU-loose"),))


@pytest.fixture
def snap(inventory) -> Snapshot:
    gpus, migs = inventory
    return Snapshot(
        T0,
        0.0,
        gpus=tuple(gpus.values()),
        entities=(*gpus.values(), *migs.values(), LOOSE),
        values=MappingProxyType({"LOOSE": MappingProxyType({FB_USED: 512.0})}),
        processes=MappingProxyType({"LOOSE": (ProcUse(4242, 512.0, 1.0),)}),
    )


@pytest.fixture
async def attribution(kubelet):
    attr = Attribution(KubeConfig("n", str(kubelet.socket_path), timeout_s=2))
    yield attr
    await attr.close()


async def test_the_last_answer_is_charged_for_stale_s_then_attribution_is_unknown(
    attribution, kubelet, snap
):
    """The kubelet answers at T0, then refuses (RESOURCE_EXHAUSTED): its answer stays
    good up to and including STALE_S later, not a moment past it; once it answers again,
    the STALE_S start over from then."""
    assert STALE_S == 10.0
    await attribution.refresh(snap)
    assert attribution.unknown(T0) == ""
    kubelet.mode = "exhausted"
    await attribution.refresh(snap)
    assert attribution.mapper.status  # not answering
    assert [attribution.unknown(T0 + dt) for dt in (2.0, STALE_S)] == ["", ""]
    assert attribution.unknown(T0 + STALE_S + 0.5) == "kubelet_throttled"
    assert attribution.unknown(T0 + 60.0) == "kubelet_throttled"
    kubelet.mode = "ok"
    attribution.mapper._retry_at = 0.0  # past its backoff
    await attribution.refresh(snap)
    assert attribution.unknown(T0 + 100.0) == ""
    kubelet.mode = "exhausted"
    attribution.mapper._retry_at = 0.0
    await attribution.refresh(snap)
    assert attribution.unknown(T0 + 100.0 + STALE_S) == ""
    assert attribution.unknown(T0 + 100.0 + STALE_S + 0.5) == "kubelet_throttled"


async def test_a_kubelet_never_reached_is_given_stale_s_from_the_first_cycle(tmp_path, snap):
    attr = Attribution(KubeConfig("n", str(tmp_path / "none.sock"), timeout_s=2))
    try:
        await attr.refresh(snap)
        assert attr.unknown(T0) == "" and attr.unknown(T0 + STALE_S) == ""
        assert attr.unknown(T0 + STALE_S + 1.0) == "kubelet_socket_missing"
    finally:
        await attr.close()


async def test_while_the_kubelet_does_not_answer_no_process_is_unaccounted(
    attribution, kubelet, snap
):
    """A GPU missing from a map that is not current says nothing about who holds it: its
    processes are neither read nor counted unaccounted until the kubelet answers."""
    kubelet.mode = "exhausted"
    await attribution.refresh(snap)
    used = {FB_USED: 512.0}
    assert attribution.wants_processes()("LOOSE", used) is False
    assert attribution.usage(snap)["LOOSE"].unaccounted_processes == 0
    kubelet.mode = "ok"
    attribution.mapper._retry_at = 0.0
    await attribution.refresh(snap)
    assert attribution.wants_processes()("LOOSE", used) is True
    use = attribution.usage(snap)["LOOSE"]
    assert (use.unaccounted_processes, use.unaccounted_bytes) == (1, 512 << 20)


async def test_a_device_one_container_holds_has_its_holder_and_a_shared_one_has_none(
    attribution, snap, inventory
):
    """GPU 0 is train-0's alone; GPU 1 is time-sliced between three pods: it gets no single
    holder (its pod labels would name one of three), nor any sharers without
    --kubernetes-virtual-gpus."""
    gpus, _ = inventory
    await attribution.refresh(snap)
    held = attribution.holders()
    assert (held[gpus[0].key].owner.namespace, held[gpus[0].key].owner.pod) == ("ml", "train-0")
    assert gpus[1].key not in held
    assert attribution.sharers() == {}
    assert attribution.status().kubelet_up
