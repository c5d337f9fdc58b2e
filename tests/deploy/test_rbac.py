"""The ClusterRole grants exactly the API calls the exporter makes: the pod watch (with
and without DRA) runs against the fake API server, every request it sends is recorded
and mapped to (API group, resource, verb), and the set is compared with the rules."""

from __future__ import annotations

import time
from typing import Any

import pytest

from exporter.workloads.apiserver.apiclient import ApiClient
from exporter.workloads.apiserver.kubeconfig import ClusterConfig
from exporter.workloads.apiserver.watch import PodWatcher, Timing
from tests.support.fakeapi import FakeAPIServer, load

FAST = Timing(backoff_initial_s=0.05, backoff_max_s=0.2, watch_timeout_s=30, read_grace_s=5)
# HTTP method -> verb for a request without an object name (collections).
COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
OBJECT_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def verb_of(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str] | None:
    """(group, resource, verb) of one request, as the API server's authorizer sees it;
    None for discovery documents (/api, /apis/<group>[/<version>]), which are
    non-resource URLs open to every authenticated user (system:discovery)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]  # /api/v1/...
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]  # /apis/<group>/<version>/...
    elif parts[0] == "apis":
        return None
    else:
        raise AssertionError(f"{method} {path}: not an API path")
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"  # a subresource
    if len(rest) == 1:
        verb = "watch" if query.get("watch") in ("true", "1") else COLLECTION_VERBS[method]
    else:
        verb = OBJECT_VERBS[method]
    return group, resource, verb


def recorded_calls(dra: bool) -> set[tuple[str, str, str]]:
    """What a pod watcher asks of the API server: a list and a watch of each resource,
    a watch resumed after a cut and a list again after 410 Gone."""
    with FakeAPIServer(load("pods.yaml"), load("resourceslices-v1.yaml")) as api:
        client = ApiClient(ClusterConfig(server=api.url))
        w = PodWatcher("node-a", api_client=client, dra=dra, timing=FAST)
        w.start()
        try:
            watches = 3 if dra else 1  # pods; ResourceSlices and ResourceClaims
            wait(
                lambda: (
                    w.synced and sum(q.get("watch") == "true" for _, q in api.requests) >= watches
                )
            )
            lists = len(api.requests)
            api.freeze()  # the open watches miss the change, so they resume from before it
            api.modify(load("pods.yaml")[0])
            api.compact()
            api.break_watches()
            api.thaw()
            wait(lambda: len(api.requests) >= lists + 2 * watches)
        finally:
            w.stop()
            gone = [q for p, q in api.requests if q.get("watch") and q["resourceVersion"] != "0"]
            assert len(gone) > watches  # a watch was resumed after the cut
        calls = list(api.calls)
    found = {v for v in (verb_of(*c) for c in calls) if v is not None}
    assert ("", "pods", "list") in found and ("", "pods", "watch") in found
    return found


def wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the watcher did not get that far"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def calls() -> dict[str, set[tuple[str, str, str]]]:
    return {"base": recorded_calls(dra=False), "dra": recorded_calls(dra=True)}


def granted(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    (role,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpu-exporter"
    ]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_mapping_of_requests_to_verbs():
    assert verb_of("GET", "/api/v1/pods", {"watch": "true"}) == ("", "pods", "watch")
    assert verb_of("GET", "/api/v1/namespaces/ns/pods/p", {}) == ("", "pods", "get")
    assert verb_of("GET", "/api/v1/namespaces/ns/pods/p/log", {}) == ("", "pods/log", "get")
    assert verb_of("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", {}) == (
        "apps", "deployments", "patch",
    )  # fmt: skip
    assert verb_of("GET", "/apis/resource.k8s.io", {}) is None


def test_the_pod_watch_lists_and_watches_resourceslices_and_claims_with_dra(calls):
    assert calls["dra"] - calls["base"] == {
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
    }


def test_every_target_grants_only_what_the_code_calls(rendered, calls):
    for name, objs in rendered.items():
        assert granted(objs) <= calls["dra"], name


def test_pods_and_dra_grant_exactly_what_the_code_calls(rendered, calls):
    assert granted(rendered["dra"]) == calls["dra"]
    assert granted(rendered["base"]) == calls["base"]
