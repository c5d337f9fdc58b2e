"""The committed gRPC stubs are what the regenerate command makes from the .proto."""

import pytest

from exporter.workloads.kubelet import protogen


def test_stubs_match_the_proto():
    pytest.importorskip(
        "grpc_tools", reason="grpcio-tools is a test dependency: pip install -e '.[test]'"
    )
    fresh = protogen.render_to_temp()
    assert sorted(fresh) == ["podresources_pb2.py", "podresources_pb2_grpc.py"]
    for name, text in fresh.items():
        committed = (protogen.OUT / name).read_text()
        assert committed == text, (
            f"{name} is stale: run python -m exporter.workloads.kubelet.protogen"
        )


def test_proto_has_the_v1_service_and_dra_fields():
    from exporter.workloads.kubelet.generated import podresources_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert {m.name for m in svc.methods} == {"List", "Get", "GetAllocatableResources"}
    cr = pb.ClaimResource.DESCRIPTOR.fields_by_name
    assert (cr["device_name"].number, cr["share_id"].number) == (4, 5)
    assert pb.ContainerResources.DESCRIPTOR.fields_by_name["dynamic_resources"].number == 5
