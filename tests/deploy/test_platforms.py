"""Platform specifics on the rendered manifests: GPU Operator driver upgrades, OpenShift's
SCC and namespace labels, and an install into an existing namespace, by our overlay or by
a plain `namespace:` over the base or any overlay."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, MOVED_NAMESPACE, OVERLAYS, render


def _kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = _kind(objs, "DaemonSet")
    return ds["spec"]["template"]["spec"]


def test_gpu_operator_driver_manager_finds_the_daemonset(rendered):
    """The driver manager stops DaemonSets with this key in their nodeSelector."""
    for name in ("gpu-operator", "all", "moved"):
        assert _pod(rendered[name])["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true"}
    assert "nodeSelector" not in _pod(rendered["base"])  # older operators set no such label


def test_no_target_tolerates_every_taint(rendered):
    for name, objs in rendered.items():
        for t in _pod(objs)["tolerations"]:
            assert t.get("key"), f"{name}: a toleration without a key tolerates every taint"
            assert t["key"] != "nvidia.com/gpu-driver-upgrade", name


def test_openshift_scc_admits_exactly_this_pod(rendered):
    for name in ("openshift", "all", "moved"):
        objs = rendered[name]
        (scc,) = _kind(objs, "SecurityContextConstraints")
        assert scc["apiVersion"] == "security.openshift.io/v1"
        assert "namespace" not in scc["metadata"]  # cluster-scoped
        assert scc["allowPrivilegedContainer"] is False
        assert scc["allowPrivilegeEscalation"] is False
        assert not scc["allowHostNetwork"] and not scc["allowHostIPC"]
        assert scc["allowedCapabilities"] == [] and scc["requiredDropCapabilities"] == ["ALL"]
        assert scc["users"] == [] and scc["groups"] == []
        pod = _pod(objs)
        volumes = {k for v in pod["volumes"] for k in v if k != "name"}
        assert volumes <= {"hostPath" if v == "hostPath" else v for v in scc["volumes"]}
        assert scc["allowHostDirVolumePlugin"] is True
        assert scc["allowHostPID"] or not pod.get("hostPID")
        assert scc["readOnlyRootFilesystem"] is True
        (role,) = [r for r in _kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-scc")]
        assert role["rules"] == [
            {
                "apiGroups": ["security.openshift.io"],
                "resources": ["securitycontextconstraints"],
                "resourceNames": [scc["metadata"]["name"]],
                "verbs": ["use"],
            }
        ]
        (binding,) = [
            b
            for b in _kind(objs, "ClusterRoleBinding")
            if b["roleRef"]["name"] == role["metadata"]["name"]
        ]
        (account,) = _kind(objs, "ServiceAccount")
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]


def test_openshift_namespace_labels(rendered):
    (ns,) = _kind(rendered["all"], "Namespace")  # deploy/namespace with the component
    labels = ns["metadata"]["labels"]
    assert labels["openshift.io/cluster-monitoring"] == "true"
    assert labels["security.openshift.io/scc.podSecurityLabelSync"] == "false"
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_existing_namespace_changes_nothing_of_it(rendered):
    for name in ("existing-namespace", "moved"):
        objs = rendered[name]
        assert not _kind(objs, "Namespace")
        cluster = {o["kind"] for o in objs if "namespace" not in o["metadata"]}
        assert cluster <= {"ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"}
        for b in _kind(objs, "ClusterRoleBinding"):
            assert {s["namespace"] for s in b["subjects"]} == {MOVED_NAMESPACE}
        assert {o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"]} == {
            MOVED_NAMESPACE
        }


def test_openshift_platform_prometheus_reads_only_this_namespaces_targets(rendered):
    for name in ("openshift", "all", "moved"):
        objs = rendered[name]
        (role,) = _kind(objs, "Role")
        (binding,) = _kind(objs, "RoleBinding")
        (account,) = _kind(objs, "ServiceAccount")
        ns = account["metadata"]["namespace"]
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == ns
        for rule in role["rules"]:
            assert rule["verbs"] == ["get", "list", "watch"], rule
        resources = {r for rule in role["rules"] for r in rule["resources"]}
        assert resources == {"services", "endpoints", "endpointslices", "pods"}
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "prometheus-k8s",
                "namespace": "openshift-monitoring",
            }
        ]


@pytest.mark.parametrize("under", ["base", *OVERLAYS])
def test_a_namespace_field_over_any_overlay_moves_the_install(tmp_path, under):
    """What kustomize users write: `namespace: monitoring` in their kustomization over the
    base or an overlay. Every object lands there, every binding of our ServiceAccount names
    it there (kustomize follows the ServiceAccount only when its namespace is spelt out in
    the base), and no Namespace object comes along to be applied over theirs."""
    site = tmp_path / "site"
    site.mkdir()
    folder = DEPLOY / under if under == "base" else DEPLOY / "overlays" / under
    (site / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": MOVED_NAMESPACE,
                "resources": [os.path.relpath(folder, site)],
            }
        )
    )
    objs = render(site)
    assert not _kind(objs, "Namespace")
    (account,) = _kind(objs, "ServiceAccount")
    assert account["metadata"]["namespace"] == MOVED_NAMESPACE
    ours = [
        s
        for b in _kind(objs, "ClusterRoleBinding") + _kind(objs, "RoleBinding")
        for s in b["subjects"]
        if s["name"] == account["metadata"]["name"]
    ]
    assert ours and {s["namespace"] for s in ours} == {MOVED_NAMESPACE}
    cluster = {"ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"}
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] not in cluster}
    assert namespaces == {MOVED_NAMESPACE}
