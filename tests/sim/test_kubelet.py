"""The simulator's own kubelet (exporter/sim/kubelet.py): the exporter's real pod-resources
client lists the fleet's pods from it, as they start and stop in sim time, and
``--simulate -k`` uses it only when no socket was given."""

from __future__ import annotations

import os

import pytest

from exporter import sim
from exporter.cli import _simulated_kubelet, build_parser
from exporter.config.resolve import config_from
from exporter.sim.kubelet import SimKubelet
from exporter.workloads.kubelet import grpcclient
from exporter.workloads.kubelet.podresources import PodResourcesClient


@pytest.fixture
def node():
    clock = sim.ManualClock()
    driver = sim.install(None, clock=clock)
    kubelet = SimKubelet(driver).start()
    try:
        yield driver, kubelet
    finally:
        kubelet.close()
        sim.uninstall()


def _listed(answer) -> dict[str, list[str]]:
    return {
        f"{p.namespace}/{p.name}": [
            i for c in p.containers for d in c.devices for i in d.device_ids
        ]
        for p in answer.pod_resources
    }


async def test_the_real_client_lists_the_fleets_pods_as_they_come_and_go(node):
    driver, kubelet = node
    client = PodResourcesClient(kubelet.socket)
    try:
        for t in (0, 61, 901):
            driver.advance(t - driver.now())
            want = {
                f"{p['namespace']}/{p['name']}": p["containers"][0]["devices"][0]["device_ids"]
                for p in driver.pods()
            }
            assert _listed(await client.list()) == want
        listed = _listed(await client.list())
        assert "research/notebook" in listed and "ml/finetune" not in listed  # 60 s, 900 s
        gpu1 = driver.gpus[1].uuid
        assert listed["batch/batch-b"] == [f"{gpu1}::1"]  # a time-sliced replica
        assert listed["ml/big-mig"] == [driver.gpus[7].mig_by_gi(2).uuid]
    finally:
        await client.close()


async def test_other_methods_are_unimplemented(node):
    _, kubelet = node
    channel = grpcclient.Channel(kubelet.socket, max_message=1 << 20)
    try:
        with pytest.raises(grpcclient.CallError) as e:
            await channel.call("/v1.PodResourcesLister/Get", b"", 5.0)
        assert e.value.code == "UNIMPLEMENTED"
    finally:
        await channel.close()


async def test_many_pods_pass_the_flow_control_window(node):
    """An answer over HTTP/2's initial 64 KiB window is sent as the client opens it."""
    driver, kubelet = node
    many = [
        {
            "name": f"pod-{i:05d}-" + "x" * 40,
            "namespace": "load",
            "containers": [{"name": "c", "devices": [{"resource_name": "r", "device_ids": ["d"]}]}],
        }
        for i in range(2000)
    ]
    driver.pods = lambda t=None: many  # type: ignore[method-assign]
    client = PodResourcesClient(kubelet.socket)
    try:
        assert len((await client.list()).pod_resources) == 2000
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("argv", "env", "wanted"),
    [
        (["--simulate", "-k"], {}, True),
        (["--simulate", "-k", "--pod-resources-kubelet-socket", "/x.sock"], {}, False),
        (["--simulate", "-k"], {"DCGM_POD_RESOURCES_KUBELET_SOCKET": "/x.sock"}, False),
        (["--simulate"], {}, False),
        (["-k"], {}, False),
    ],
)
def test_only_simulate_k_without_a_socket_gets_the_simulated_kubelet(
    argv, env, wanted, monkeypatch
):
    for name in ("DCGM_POD_RESOURCES_KUBELET_SOCKET", "DCGM_EXPORTER_KUBERNETES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(argv)
    assert _simulated_kubelet(args, config_from(args, os.environ)) is wanted
