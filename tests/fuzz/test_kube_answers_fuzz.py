"""Kubelet List answers and API-server objects of any shape: mapped or indexed without an
exception, and whatever is kept stays within the bounds of exporter/workloads/limits.py."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from exporter.workloads import limits
from exporter.workloads.apiserver.podindex import RESERVED_LABELS, LabelPolicy, PodIndex
from exporter.workloads.apiserver.slices import SliceIndex
from exporter.workloads.kubelet.generated import podresources_pb2 as pb
from exporter.workloads.kubelet.podresources import PodResourcesClient
from exporter.workloads.limits import Drops
from exporter.workloads.mapper import Mapper
from tests.fuzz.strategies import FAST, SCALARS, TEXT, yaml_like
from tests.fuzz.test_ids_fuzz import GPUS, MIGS, NEAR, RESOLVER

KEYS = {d.key for d in GPUS + MIGS}


def _wire(text: str) -> str:
    """Text as protobuf carries it (valid UTF-8: no lone surrogates)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


PBTEXT = TEXT.map(_wire)
REAL_IDS = st.sampled_from(sorted(KEYS))
DEVICE_ID = st.one_of(REAL_IDS, NEAR.map(_wire), PBTEXT)
RESOURCE = st.one_of(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]), PBTEXT)
LABEL_NAME = st.one_of(
    st.sampled_from(sorted(RESERVED_LABELS)), st.text(string.ascii_letters + "./-_0123456789"), TEXT
)


@st.composite
def list_answers(draw) -> pb.ListPodResourcesResponse:
    resp = pb.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, 4))):
        pod = resp.pod_resources.add(name=draw(PBTEXT), namespace=draw(PBTEXT))
        for _ in range(draw(st.integers(0, 3))):
            c = pod.containers.add(name=draw(PBTEXT))
            for _ in range(draw(st.integers(0, 3))):
                c.devices.add(
                    resource_name=draw(RESOURCE),
                    device_ids=draw(st.lists(DEVICE_ID, max_size=5)),
                )
            for _ in range(draw(st.integers(0, 2))):
                dr = c.dynamic_resources.add(claim_name=draw(PBTEXT), claim_namespace=draw(PBTEXT))
                dr.claim_resources.add(
                    driver_name=draw(st.sampled_from(["gpu.nvidia.com", "x"])),
                    pool_name=draw(PBTEXT),
                    device_name=draw(PBTEXT),
                )
    return resp


@FAST
@given(st.lists(list_answers(), min_size=1, max_size=2))
def test_any_kubelet_answer_maps_to_known_devices(answers):
    m = Mapper(PodResourcesClient("/nonexistent"), slice_device=lambda *a: None)
    for resp in answers:
        pm = m.build(resp, RESOLVER)
        assert set(pm.owners) <= KEYS
        assert all(owners for owners in pm.owners.values())
    assert len(m.unmatched) <= limits.MAX_UNMATCHED_RESOURCES + 1


POD_KEYS = ["kubernetes.io/config.mirror"]


@st.composite
def pods(draw):
    labels = draw(st.dictionaries(LABEL_NAME, st.one_of(TEXT, SCALARS), max_size=8))
    meta = {
        "uid": draw(st.one_of(TEXT, SCALARS)),
        "name": draw(st.one_of(st.sampled_from(["a", "b"]), TEXT, SCALARS)),
        "namespace": draw(st.one_of(st.just("ns"), SCALARS)),
        "labels": draw(st.one_of(st.just(labels), SCALARS)),
        "annotations": draw(st.one_of(SCALARS, st.just({POD_KEYS[-1]: "m"}))),
    }
    status = draw(st.one_of(SCALARS, st.just({"containerStatuses": [
        {"name": draw(TEXT), "containerID": draw(st.one_of(TEXT, st.just("containerd://ab")))}
    ]})))  # fmt: skip
    return draw(st.one_of(st.just({"metadata": meta, "status": status}), SCALARS))


@FAST
@given(
    st.lists(pods(), max_size=3),
    st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), pods()), max_size=5),
)
def test_any_pod_objects_index_within_bounds(listed, watched):
    index = PodIndex(LabelPolicy("[a-z].*", True), Drops())
    index.replace(listed)
    for kind, obj in watched:
        index.event(kind, obj)
    uids, names = index.sizes()
    assert names <= uids <= 2 * names
    for p in index.pods():
        assert index.pod(p.uid) is p
        assert len(p.labels) <= limits.MAX_POD_LABELS
        for name, value in p.labels.items():
            assert name not in RESERVED_LABELS and not name.startswith("__")
            assert name and set(name) <= set(string.ascii_letters + string.digits + "_")
            assert not name[0].isdigit()
            assert len(value) <= limits.MAX_LABEL_VALUE_CHARS


SLICE_KEYS = ["spec", "driver", "pool", "name", "generation", "devices", "attributes", "basic",
              "uuid", "string", "int", "metadata"]  # fmt: skip


@FAST
@given(
    st.lists(yaml_like(SLICE_KEYS), max_size=4),
    st.lists(st.tuples(st.sampled_from(["ADDED", "DELETED"]), yaml_like(SLICE_KEYS)), max_size=6),
)
def test_any_resource_slices_index(listed, watched):
    index = SliceIndex(Drops())
    index.replace(listed)
    for kind, obj in watched:
        index.event(kind, obj)
    assert len(index) <= limits.MAX_SLICE_DEVICES
