"""The ClusterRole grants exactly the API calls the exporter's code makes: every Kubernetes
client call under exporter/kube/ is found by name and mapped to (API group, resource, verb)."""

from __future__ import annotations

import re
from typing import Any

from tests.procs import ROOT

KUBE = ROOT / "exporter" / "kube"
# Resource (as the client's method names spell it) -> (API group, plural); a call on a
# resource not listed here fails the test, so a new API call needs its RBAC decided first.
RESOURCES = {
    "pod": ("", "pods"),
    "resource_slice": ("resource.k8s.io", "resourceslices"),
}
VERBS = {
    "list": "list",
    "read": "get",
    "create": "create",
    "patch": "patch",
    "delete": "delete",
    "replace": "update",
    "connect": "create",
}
# Discovery documents (GET /apis/<group>) are non-resource URLs, open to every
# authenticated user by the default system:discovery role: no rule needed.
DISCOVERY = {"get_api_group", "get_api_resources", "get_api_versions", "get_code"}
METHOD = re.compile(
    r"(?P<verb>[a-z]+)_(?:namespaced_)?(?P<resource>[a-z_]+?)"
    r"(?:_for_all_namespaces)?(?:_with_http_info)?$"
)


def client_methods() -> set[str]:
    """Every method of the kubernetes client's API classes (CoreV1Api, ResourceV1Api, ...)."""
    from kubernetes import client

    return {
        name
        for cls_name in dir(client)
        if cls_name.endswith("Api") and isinstance(getattr(client, cls_name), type)
        for name in vars(getattr(client, cls_name))
        if re.match(r"(list|read|create|patch|delete|replace|connect|get)_", name)
    }


def code_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) for every client call in exporter/kube/, recursively."""
    methods = client_methods()
    found: set[tuple[str, str, str]] = set()
    paths = [p for p in sorted(KUBE.rglob("*.py")) if "generated" not in p.parts]
    # (generated: protobuf stubs for the kubelet's gRPC API, not the API server)
    # the reflector (a module of its own) calls each list function again with watch=True
    watches = any("watch=True" in p.read_text() for p in paths)
    for path in paths:
        text = path.read_text()
        assert "call_api(" not in text, f"{path.name}: raw API calls need their RBAC checked"
        for name in set(re.findall(r"\.([a-z_]+)\b", text)) & methods - DISCOVERY:
            m = METHOD.fullmatch(name)
            assert m and m.group("verb") in VERBS, f"{path.name}: {name} has no RBAC mapping"
            assert m.group("resource") in RESOURCES, f"{path.name}: {name} has no RBAC mapping"
            group, plural = RESOURCES[m.group("resource")]
            found.add((group, plural, VERBS[m.group("verb")]))
            if m.group("verb") == "list" and watches:
                found.add((group, plural, "watch"))
    return found


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


def test_the_scan_finds_the_pod_watch():
    calls = code_calls()
    assert ("", "pods", "list") in calls and ("", "pods", "watch") in calls


def test_every_target_grants_only_what_the_code_calls(rendered):
    calls = code_calls()
    for name, objs in rendered.items():
        assert granted(objs) <= calls, name


def test_pods_and_dra_together_grant_everything_the_code_calls(rendered):
    assert granted(rendered["dra"]) == code_calls()
    assert granted(rendered["base"]) == {(g, r, v) for g, r, v in code_calls() if r == "pods"}
