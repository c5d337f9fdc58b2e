"""PodWatcher through the exporter's API client against a fake API server
(tests/support/fakeapi.py) that speaks the API's wire format over HTTP."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.workloads.apiserver.apiclient import ApiClient
from exporter.workloads.apiserver.kubeconfig import ClusterConfig
from exporter.workloads.apiserver.watch import PodWatcher, Timing, sanitize_label_name
from exporter.workloads.cgroups import container_of
from tests.support.fakeapi import FakeAPIServer, load

ROOT = Path(__file__).parents[3]
PROC = str(ROOT / "tests" / "fixtures" / "proc")
PODS = load("pods.yaml")
NODE_A = {p["metadata"]["name"] for p in PODS if p["spec"]["nodeName"] == "node-a"}
TRAIN_UID = "5c0ba7e2-3f1d-4c6a-9b8e-1a2b3c4d5e6f"
PODS_PATH = "/api/v1/pods"
FAST = Timing(
    backoff_initial_s=0.05,
    backoff_max_s=0.2,
    watch_timeout_s=30,
    read_grace_s=5,
    connect_timeout_s=1,
    list_timeout_s=5,
)


def wait_until(predicate, timeout=10.0, what=""):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.01)


def client_for(url):
    return ApiClient(ClusterConfig(server=url))


def pod(name):
    return copy.deepcopy(next(p for p in PODS if p["metadata"]["name"] == name))


def new_pod(name, node="node-a", uid="aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"):
    p = pod("worker-0")
    p["metadata"].update(name=name, uid=uid, labels={"team": "new"})
    p["spec"]["nodeName"] = node
    p["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "ab" * 32
    return p


@pytest.fixture
def watchers():
    made = []

    def make(url, **kw):
        kw.setdefault("timing", FAST)
        w = PodWatcher("node-a", api_client=client_for(url), **kw)
        made.append(w)
        w.start()
        return w

    yield make
    for w in made:
        w.stop()


@pytest.fixture
def api():
    with FakeAPIServer(PODS, load("resourceslices-v1.yaml")) as srv:
        yield srv


def names(w):
    return {p.name for p in w.pods()}


def synced(w):
    wait_until(lambda: w.synced and w.status == "", timeout=20, what=lambda: f"sync ({w.status!r})")


# -- listing --


def test_initial_list_sends_field_selector_and_holds_only_this_node(api, watchers):
    w = watchers(api.url)
    synced(w)
    assert names(w) == NODE_A
    assert w.pod("11111111-2222-4333-8444-555555555555") is None  # node-b's pod
    lists = [q for p, q in api.requests if p == PODS_PATH and "watch" not in q]
    assert lists and all(q["fieldSelector"] == "spec.nodeName=node-a" for q in lists)
    wait_until(lambda: api.count(PODS_PATH, watch=True) == 1)
    watch = next(q for p, q in api.requests if p == PODS_PATH and q.get("watch") == "true")
    assert watch["fieldSelector"] == "spec.nodeName=node-a"
    assert watch["allowWatchBookmarks"] == "true"
    assert int(watch["timeoutSeconds"]) >= FAST.watch_timeout_s
    assert watch["resourceVersion"] == str(api._rv)


def test_pod_info_from_the_list(api, watchers):
    w = watchers(api.url)
    synced(w)
    p = w.pod(TRAIN_UID)
    assert (p.name, p.namespace, p.uid) == ("train-0", "ml", TRAIN_UID)
    assert dict(p.containers) == {
        "06ea17a8981d25b0315ff17bd1ebad3d95c15a3f8b764eaadb93612d9b61a54e": "trainer",
        "6c8b4535ccc87f19061c4646189e33d78f01c8b63dc4e3cb2f630b1796ee93b6": "sidecar",
        "bb54068aea85faa7e487530083366be9962390af822e4c71ef1aca7033c83e66": "fetch-weights",
    }
    assert w.pod_by_name("ml", "train-0") is p
    assert dict(p.labels) == {}  # no allow-list: no labels
    assert w.pod_by_name("serve", "infer-1").containers  # cri-o:// prefix stripped
    assert w.slice_device("gpu.nvidia.com", "node-a", "gpu-0") is None  # DRA off


def test_cgroup_fixtures_join_to_pods_and_containers(api, watchers):
    w = watchers(api.url)
    synced(w)
    expect = {
        1001: ("ml", "train-0", "trainer"),
        1002: ("ml", "train-0", "sidecar"),
        1003: ("serve", "infer-1", "server"),
        1004: ("lab", "notebook", "notebook"),
        1005: ("batch", "besteffort-job-x7k2p", "job"),
        1006: ("batch", "worker-0", "worker"),
        1011: ("kube-system", "gpu-probe-node-a", "probe"),  # static pod, via its mirror
        1012: ("ml", "train-0", None),  # pause container: pod known, no container name
        1014: ("lab", "notebook", None),
    }
    for pid, (ns, name, container) in expect.items():
        ref = container_of(pid, PROC)
        p = w.pod(ref.pod_uid)
        assert (p.namespace, p.name, p.containers.get(ref.container_id)) == (ns, name, container)


# -- watching --


def test_watch_add_modify_delete(api, watchers):
    w = watchers(api.url)
    synced(w)
    api.add(new_pod("elsewhere", node="node-b", uid="bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"))
    api.add(new_pod("fresh"))
    wait_until(lambda: "fresh" in names(w), what="ADDED")
    assert "elsewhere" not in names(w)

    changed = new_pod("fresh")
    changed["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "cd" * 32
    changed["metadata"]["labels"] = {"team": "changed"}
    api.modify(changed)
    wait_until(lambda: "cd" * 32 in w.pod_by_name("batch", "fresh").containers, what="MODIFIED")
    assert "ab" * 32 not in w.pod_by_name("batch", "fresh").containers

    api.delete(changed)
    wait_until(lambda: "fresh" not in names(w), what="DELETED")
    assert w.pod("aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee") is None
    assert w.pod_by_name("batch", "fresh") is None
    assert api.count(PODS_PATH, watch=False) == 1  # all through one watch


def test_recreated_pod_with_same_name_replaces_old_uid(api, watchers):
    w = watchers(api.url)
    synced(w)
    api.delete(pod("train-0"))
    again = pod("train-0")
    again["metadata"]["uid"] = "cccccccc-cccc-4ccc-8ccc-cccccccccccc"
    api.add(again)
    wait_until(lambda: w.pod("cccccccc-cccc-4ccc-8ccc-cccccccccccc") is not None)
    assert w.pod(TRAIN_UID) is None
    assert w.pod_by_name("ml", "train-0").uid == "cccccccc-cccc-4ccc-8ccc-cccccccccccc"


def test_broken_watch_resumes_from_last_resource_version(api, watchers):
    w = watchers(api.url)
    synced(w)
    rv = api.add(new_pod("before-break"))
    wait_until(lambda: "before-break" in names(w))
    api.break_watches()
    wait_until(lambda: api.count(PODS_PATH, watch=True) >= 2, what="a second watch")
    api.add(new_pod("after-break", uid="dddddddd-dddd-4ddd-8ddd-dddddddddddd"))
    wait_until(lambda: "after-break" in names(w))
    watches = [q for p, q in api.requests if p == PODS_PATH and q.get("watch") == "true"]
    assert watches[1]["resourceVersion"] == str(rv)
    assert api.count(PODS_PATH, watch=False) == 1  # resumed, not relisted


@pytest.mark.parametrize("gone_as", ["status", "event"])
def test_410_gone_relists(watchers, gone_as):
    with FakeAPIServer(PODS, gone_as=gone_as) as api:
        w = watchers(api.url)
        synced(w)
        wait_until(lambda: api.count(PODS_PATH, watch=True) == 1)
        # Changes the watch never delivers, then history compacted past them.
        api.freeze()
        api.delete(pod("notebook"))
        api.add(new_pod("missed"))
        api.compact()
        api.break_watches()
        api.thaw()
        wait_until(lambda: api.count(PODS_PATH, watch=False) == 2, what="a relist")
        wait_until(lambda: "missed" in names(w) and "notebook" not in names(w))
        wait_until(lambda: w.status == "")
        first, relist = [q for p, q in api.requests if p == PODS_PATH and "watch" not in q]
        assert first["resourceVersion"] == "0"  # from the watch cache
        assert "resourceVersion" not in relist  # consistent: never back in time


def test_watch_timeout_rewatches_without_relisting(watchers):
    with FakeAPIServer(PODS) as api:
        w = watchers(api.url, timing=Timing(backoff_initial_s=0.05, watch_timeout_s=1))
        synced(w)
        wait_until(lambda: api.count(PODS_PATH, watch=True) >= 2, timeout=4)
        api.add(new_pod("late"))
        wait_until(lambda: "late" in names(w))
        assert api.count(PODS_PATH, watch=False) == 1
        assert w.status == ""


def test_stalled_watch_is_noticed_by_the_read_timeout(watchers):
    timing = Timing(backoff_initial_s=0.05, watch_timeout_s=1, read_grace_s=0.3)
    with FakeAPIServer(PODS) as api:
        api.stall = True  # headers, then silence past timeoutSeconds
        w = watchers(api.url, timing=timing)
        synced(w)
        wait_until(lambda: "read timed out" in w.status, timeout=4, what="read timeout")
        api.stall = False
        wait_until(lambda: api.count(PODS_PATH, watch=True) >= 2)
        api.add(new_pod("after-stall"))
        wait_until(lambda: "after-stall" in names(w))
        assert api.count(PODS_PATH, watch=False) == 1


def test_bookmark_moves_the_resume_point(api, watchers):
    w = watchers(api.url)
    synced(w)
    wait_until(lambda: api.count(PODS_PATH, watch=True) == 1)
    api.add(new_pod("seen"))
    wait_until(lambda: "seen" in names(w))
    api.bookmark()
    bookmark_rv = api._rv
    time.sleep(0.1)  # let the bookmark through before the break; harmless if slower
    api.break_watches()
    wait_until(lambda: api.count(PODS_PATH, watch=True) >= 2)
    watches = [q for p, q in api.requests if p == PODS_PATH and q.get("watch") == "true"]
    assert int(watches[1]["resourceVersion"]) in (bookmark_rv, bookmark_rv - 1)


# -- failures --


def test_api_server_down_at_start_then_up(watchers):
    api = FakeAPIServer(PODS)  # port reserved, nothing listening yet
    w = watchers(api.url)
    wait_until(lambda: "unreachable (retrying in" in w.status, what="unreachable status")
    assert w.status.startswith("pods: API server unreachable")
    assert "refused" in w.status.lower()
    assert not w.synced and not w.pods_synced and w.pods() == []
    with api.start():
        synced(w)
        assert names(w) == NODE_A


def test_api_server_lost_keeps_last_pods_and_recovers(watchers):
    api = FakeAPIServer(PODS).start()
    try:
        w = watchers(api.url)
        synced(w)
        api.stop()
        wait_until(lambda: "unreachable" in w.status, what="unreachable status")
        assert names(w) == NODE_A and w.pods_synced  # last good data stays in use
        api.start()
        api.add(new_pod("while-back"))
        wait_until(lambda: "while-back" in names(w))
        wait_until(lambda: w.status == "")
    finally:
        api.stop()


def test_forbidden_says_which_permissions(api, watchers):
    api.deny = True
    w = watchers(api.url)
    wait_until(lambda: "403" in w.status)
    assert w.status.startswith("pods: HTTP 403 Forbidden: pods is forbidden")
    assert "list and watch on pods" in w.status and "(retrying in " in w.status
    api.deny = False
    synced(w)


def test_default_client_from_kubeconfig(api, tmp_path, monkeypatch):
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "users": [{"name": "exporter", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "exporter"}}],
        "current-context": "fake",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    w = PodWatcher("node-a", timing=FAST)
    w.start()
    try:
        synced(w)
        assert names(w) == NODE_A
    finally:
        w.stop()
    assert json.loads(path.read_text()) == kubeconfig  # never written back


def test_no_configuration_at_all(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    w = PodWatcher("node-a", timing=FAST)
    w.start()
    try:
        wait_until(lambda: "no Kubernetes configuration" in w.status)
        assert w.status.startswith("pods: no Kubernetes configuration: not in a cluster")
    finally:
        w.stop()


def test_an_exec_plugin_is_named_whole_in_the_status(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = Path(__file__).parents[2] / "fixtures" / "kubeconfig" / "exec-plugin.yaml"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    w = PodWatcher("node-a", timing=FAST)
    w.start()
    try:
        wait_until(lambda: "exec plugin" in w.status)
        assert "give it a token, tokenFile or client certificate instead) (retrying in" in w.status
    finally:
        w.stop()


def test_stop_returns_quickly_with_a_watch_open(api):
    w = PodWatcher("node-a", api_client=client_for(api.url), timing=Timing(), dra=True)
    w.start()
    synced(w)
    wait_until(lambda: api.count(PODS_PATH, watch=True) == 1)
    threads = list(w._threads)
    started = time.monotonic()
    w.stop()
    assert time.monotonic() - started < 1.0
    assert len(threads) == 3 and not any(t.is_alive() for t in threads)  # pods, slices, claims


# -- labels --


def test_label_allow_list_and_sanitizing(api, watchers):
    w = watchers(api.url, label_allow=r"app\.kubernetes\.io/.*|team|owner\.example\.com.*")
    synced(w)
    assert dict(w.pod(TRAIN_UID).labels) == {
        "label_app_kubernetes_io_name": "trainer",
        "label_app_kubernetes_io_instance": "llama-ft",
        "label_team": "ml",
    }
    # "owner.example.com/user" and "owner.example.com_user" clash; the first name wins.
    notebook = w.pod_by_name("lab", "notebook")
    assert dict(notebook.labels) == {"label_owner_example_com_user": "alice"}
    assert dict(w.pod_by_name("batch", "worker-0").labels) == {}
    api.modify(new_pod("labelled"))
    wait_until(lambda: w.pod_by_name("batch", "labelled") is not None)
    assert dict(w.pod_by_name("batch", "labelled").labels) == {"label_team": "new"}


def test_allow_list_matches_whole_names(api, watchers):
    w = watchers(api.url, label_allow="app")
    synced(w)
    assert dict(w.pod_by_name("lab", "notebook").labels) == {"label_app": "jupyter"}
    assert dict(w.pod(TRAIN_UID).labels) == {}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
        ("team", "label_team"),
        ("k8s-app", "label_k8s_app"),
        ("Example.COM/Tier_2", "label_Example_COM_Tier_2"),
    ],
)
def test_sanitize_label_name(name, expected):
    assert sanitize_label_name(name) == expected


def test_bad_arguments():
    with pytest.raises(ValueError, match="not a regex"):
        PodWatcher("node-a", api_client=object(), label_allow="app[")
    with pytest.raises(ValueError, match="NODE_NAME"):
        PodWatcher("", api_client=object())


# -- DRA ResourceSlices --

H100_0 = "GPU-8e3c1f0a-5b2d-4c7e-9a1f-0b2c3d4e5f60"
H100_1 = "GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
MIG_1G = "MIG-2b7f1c9e-3d4a-5b6c-8d7e-9f0a1b2c3d4e"


@pytest.mark.parametrize(
    "fixture, served, used",
    [
        ("resourceslices-v1beta1.yaml", ("v1beta1",), "v1beta1"),  # Kubernetes 1.32
        ("resourceslices-v1beta1.yaml", ("v1beta1", "v1beta2"), "v1beta2"),  # 1.33
        ("resourceslices-v1.yaml", ("v1", "v1beta2", "v1beta1"), "v1"),  # 1.34+
        ("resourceslices-v1.yaml", ("v1beta1",), "v1beta1"),  # served in the beta1 shape
    ],
)
def test_resource_slices_resolve_to_uuids(watchers, fixture, served, used):
    with FakeAPIServer(PODS, load(fixture), slice_versions=served) as api:
        w = watchers(api.url, dra=True)
        synced(w)
        gpu = w.slice_device("gpu.nvidia.com", "node-a", "gpu-0")
        assert (gpu.type, gpu.uuid, gpu.parent_uuid, gpu.profile) == ("gpu", H100_0, "", "")
        mig = w.slice_device("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-0")
        assert (mig.type, mig.uuid, mig.parent_uuid) == ("mig", MIG_1G, H100_1)
        assert mig.profile == "1g.10gb"
        dyn = w.slice_device("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-3")
        assert (dyn.type, dyn.uuid, dyn.parent_uuid, dyn.profile) == ("mig", "", H100_1, "1g.10gb")
        assert (dyn.placement, gpu.placement, mig.placement) == (3, None, 0)
        taints = (
            ("gpu.nvidia.com/xid", "79", "NoSchedule"),
            ("gpu.nvidia.com/unmonitored", "", "None"),
        )
        assert dyn.taints == (taints if "v1beta1" not in (used, fixture[15:-5]) else ())
        assert w.slice_device("gpu.nvidia.com", "node-b", "gpu-0") is None  # not this node
        path = f"/apis/resource.k8s.io/{used}/resourceslices"
        queries = [q for p, q in api.requests if p == path]
        assert queries and all(q["fieldSelector"] == "spec.nodeName=node-a" for q in queries)
        assert any(p.rstrip("/") == "/apis/resource.k8s.io" for p, _ in api.requests)


def test_resource_slices_newest_generation_qualified_names_other_drivers(watchers):
    with FakeAPIServer(PODS, load("resourceslices-v1.yaml")) as api:
        w = watchers(api.url, dra=True)
        synced(w)
        # generation 1's gpu-0 and gpu-1 linger but generation 2 is the pool now
        assert w.slice_device("gpu.nvidia.com", "node-a", "gpu-0").uuid == H100_0
        assert w.slice_device("gpu.nvidia.com", "node-a", "gpu-1") is None
        mig3 = w.slice_device("gpu.nvidia.com", "node-a", "gpu-1-mig-3g40gb-9-4")
        assert (mig3.type, mig3.profile, mig3.parent_uuid) == ("mig", "3g.40gb", H100_1)
        nic = w.slice_device("net.example.com", "node-a-nics", "nic-0")
        assert (nic.type, nic.uuid) == ("", "")


def test_resource_slice_events(watchers):
    slices = load("resourceslices-v1.yaml")
    with FakeAPIServer(PODS, slices) as api:
        w = watchers(api.url, dra=True)
        synced(w)
        current = copy.deepcopy(slices[0])
        current["spec"]["pool"]["generation"] = 3
        current["spec"]["devices"] = current["spec"]["devices"][:1]
        current["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "GPU-new"}
        api.modify(current)
        wait_until(lambda: w.slice_device("gpu.nvidia.com", "node-a", "gpu-0").uuid == "GPU-new")
        assert w.slice_device("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-0") is None
        api.delete(current)
        # generation 1 is all that is left of the pool now
        wait_until(lambda: w.slice_device("gpu.nvidia.com", "node-a", "gpu-1") is not None)


def test_dra_not_served_reports_and_pods_still_work(watchers):
    with FakeAPIServer(PODS, slice_versions=()) as api:
        w = watchers(api.url, dra=True)
        wait_until(lambda: names(w) == NODE_A)
        # only the ResourceSlices part is left once the pods are listed
        wait_until(lambda: w.status.startswith("ResourceSlices: resource.k8s.io is not served"))
        assert "(retrying in " in w.status
        assert w.pods_synced and not w.synced


# -- packaging --


def test_the_watch_does_not_import_the_kubernetes_client():
    code = (
        "import sys, exporter.workloads.apiserver.watch, exporter.workloads.apiserver.reflector, "
        "exporter.workloads.apiserver.apiclient, exporter.workloads.apiserver.kubeconfig; "
        "print(sorted(m for m in ('kubernetes', 'urllib3') "
        "if m in sys.modules) or False)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    "fixture, version",
    [
        ("pods.yaml", "1.34"),
        ("resourceslices-v1beta1.yaml", "1.32"),
        ("resourceslices-v1.yaml", "1.34"),
    ],
)
def test_fixtures_are_valid_kubernetes_objects(fixture, version):
    kv = pytest.importorskip(
        "kubernetes_validate", reason="a test dependency: pip install -e '.[test]'"
    )
    for obj in load(fixture):
        kv.validate(obj, version, strict=True)
