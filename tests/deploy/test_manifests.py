"""The Kubernetes manifests: they render, validate, follow the security policy and match the
exporter they deploy (its paths, port, flags and version); the copies: test_generated.py."""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from aiohttp import web
from kubernetes_validate import utils as kv_utils

from exporter import __version__
from exporter.config.model import DEFAULT_ADDRESS, parse_address
from exporter.http.routes import routes
from tests.deploy.conftest import COMPONENTS, DEPLOY, EXCLUSIVE, MOVED_NAMESPACE, TARGETS
from tests.procs import ROOT

NAMESPACE = "gpu-exporter"
OPERATOR_GROUP = "monitoring.coreos.com"
NO_OPERATOR = "without-prometheus-operator"
OPENSHIFT_GROUP = "security.openshift.io"
# hostPath volumes allowed, with the component that brings each in (None: the base).
HOST_PATHS = {
    "/var/lib/kubelet/pod-resources": None,
    "/var/lib/gpu-exporter": None,  # GPU accounting's state file, the one writable mount
    "/proc": "shared-gpus",
    "/home/kubernetes/bin/nvidia": "gke",
}
COMBINABLE = set(COMPONENTS) - EXCLUSIVE


def _has(target: str, component: str) -> bool:
    """Whether the rendered ``target`` includes ``component``."""
    if target == component:
        return True
    return target in ("all", "moved") and component in COMBINABLE


def _namespace(target: str) -> str:
    return MOVED_NAMESPACE if target in ("existing-namespace", "moved") else NAMESPACE


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = _kind(objs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def _pod(objs):
    return _one(objs, "DaemonSet")["spec"]["template"]


def _container(objs):
    containers = _pod(objs)["spec"]["containers"]
    assert [c["name"] for c in containers] == ["gpu-exporter"]
    return containers[0]


def _env(container) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _served_paths() -> set[str]:
    app = web.Application()
    routes(app)
    return {r.canonical for r in app.router.resources()}


@pytest.fixture(params=TARGETS)
def target(request, rendered):
    return request.param, rendered[request.param]


def test_every_namespaced_object_lands_in_the_exporters_namespace(target):
    name, objs = target
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "SecurityContextConstraints",
    }
    for o in objs:
        ns = o["metadata"].get("namespace")
        expected = None if o["kind"] in cluster_scoped else _namespace(name)
        assert ns == expected, (o["kind"], o["metadata"]["name"])
    if name == "all":  # with deploy/namespace
        assert _one(objs, "Namespace")["metadata"]["name"] == NAMESPACE
    else:  # the base and the overlays change no namespace
        assert not _kind(objs, "Namespace")


VERSIONS = sorted(set(kv_utils.all_versions()), key=kv_utils.major_minor)


def test_core_objects_validate_strictly_for_every_kubernetes_version(target):
    """kubernetes-validate's offline schemas, strict: an unknown or misspelt field fails."""
    _, objs = target
    for o in objs:
        if o["apiVersion"].startswith((OPERATOR_GROUP, OPENSHIFT_GROUP)):
            continue  # CRD kinds (below) and OpenShift's own (test_openshift_*)
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{o['kind']}/{o['metadata']['name']} on Kubernetes {version}: {e}")


def _closed(schema: Any) -> Any:
    """The CRD schema with unknown fields refused wherever it lists the known ones: the API
    server would silently drop a misspelt field instead."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _validator(schema: dict[str, Any]) -> jsonschema.Validator:
    # OpenAPI v3 schemas are JSON Schema draft 4 with extensions; draft 7 reads them. The
    # metaschema check is skipped: some CRD patterns use Go's regex syntax.
    return jsonschema.Draft7Validator(_closed(schema))


def test_operator_objects_validate_against_their_crds(target, crds):
    _, objs = target
    kinds = {o["kind"] for o in objs if o["apiVersion"].startswith(OPERATOR_GROUP)}
    assert kinds == (set() if target[0] == NO_OPERATOR else {"ServiceMonitor", "PrometheusRule"})
    for o in objs:
        if o["apiVersion"] == f"{OPERATOR_GROUP}/v1":
            body = copy.deepcopy(o)
            body["metadata"] = {}  # the CRD schema says nothing about metadata
            _validator(crds[o["kind"]]).validate(body)


def test_crd_check_catches_a_misspelt_field(rendered, crds):
    sm = copy.deepcopy(_one(rendered["base"], "ServiceMonitor"))
    sm["metadata"] = {}
    sm["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="scrapeTimout"):
        _validator(crds["ServiceMonitor"]).validate(sm)


# Security policy


def test_nothing_privileged(target):
    name, objs = target
    pod = _pod(objs)["spec"]
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert bool(pod.get("hostPID")) == _has(name, "shared-gpus")
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    privileged = _has(name, "privileged-xids")  # /dev/kmsg and MIG-instance XIDs
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc.get("privileged") is privileged
        assert sc.get("allowPrivilegeEscalation") is privileged
        assert sc.get("readOnlyRootFilesystem") is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        for mount in c.get("volumeMounts", []):
            writable = mount["name"] == "accounting-state"
            assert mount.get("readOnly") is (None if writable else True), mount
    state = [v for v in pod["volumes"] if v["name"] == "accounting-state"]
    assert state == [
        {
            "name": "accounting-state",
            "hostPath": {"path": "/var/lib/gpu-exporter", "type": "DirectoryOrCreate"},
        }
    ]
    for vol in pod["volumes"]:
        if "hostPath" in vol:
            path = vol["hostPath"]["path"]
            assert path in HOST_PATHS, path
            component = HOST_PATHS[path]
            assert component is None or _has(name, component), (name, path)


def test_the_xid_privileges_come_together(target):
    """privileged-xids gives the container what NVIDIA's container toolkit needs to expose
    the mig/monitor capability (NVIDIA_MIG_MONITOR_DEVICES=all: MIG-instance XIDs) and
    the kernel log the exporter then insists on reading; no other install asks for them."""
    name, objs = target
    env = _env(_container(objs))
    wanted = _has(name, "privileged-xids")
    assert (env.get("NVIDIA_MIG_MONITOR_DEVICES") == "all") is wanted, name
    assert (env.get("GPU_EXPORTER_KERNEL_LOG") == "/dev/kmsg") is wanted, name


def test_requests_and_limits_set(target):
    _, objs = target
    res = _container(objs)["resources"]
    units = {"m": 1e-3, "Mi": 2**20, "Gi": 2**30, "": 1}

    def quantity(q: str) -> float:
        num, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q)).groups()
        return float(num) * units[unit]

    for r in ("cpu", "memory"):
        assert quantity(res["requests"][r]) <= quantity(res["limits"][r]), r


def test_rbac_is_read_only_and_limited_to_what_is_enabled(target):
    name, objs = target
    role = _named(objs, "ClusterRole", "gpu-exporter")
    granted = {
        (group, resource): tuple(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    expected = {("", "pods"): ("list", "watch")}
    if _has(name, "dra"):
        expected[("resource.k8s.io", "resourceslices")] = ("list", "watch")
        expected[("resource.k8s.io", "resourceclaims")] = ("list", "watch")
    assert granted == expected
    binding = _named(objs, "ClusterRoleBinding", "gpu-exporter")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = _pod(objs)["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": _namespace(name)}
    ]
    roles = {"gpu-exporter", "gpu-exporter-scc"} if _has(name, "openshift") else {"gpu-exporter"}
    assert {r["metadata"]["name"] for r in _kind(objs, "ClusterRole")} == roles
    assert {b["metadata"]["name"] for b in _kind(objs, "ClusterRoleBinding")} == roles
    assert _one(objs, "ServiceAccount")["metadata"]["name"] == account
    # namespaced RBAC only for OpenShift's platform Prometheus (test_platforms.py)
    prometheus = {"gpu-exporter-prometheus"} if _has(name, "openshift") else set()
    assert {r["metadata"]["name"] for r in _kind(objs, "Role")} == prometheus
    assert {b["metadata"]["name"] for b in _kind(objs, "RoleBinding")} == prometheus


# What the exporter serves


def test_daemonset_runs_on_gpu_nodes_only(target):
    name, objs = target
    ds = _one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    expected = {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    expected |= {"cloud.google.com/gke-accelerator"} if _has(name, "gke") else set()
    expected |= {"kubernetes.azure.com/accelerator"} if _has(name, "aks") else set()
    assert keys == expected
    assert all(len(t["matchExpressions"]) == 1 for t in terms["nodeSelectorTerms"])  # ORed
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        },
    ]
    if _has(name, "aks"):
        tolerations.append(
            {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
        )
    # never every taint: each toleration names its key (the driver manager's eviction taint,
    # not-ready and unreachable stay in force)
    assert pod["tolerations"] == tolerations
    selector = {"nvidia.com/gpu.deploy.client": "true"} if _has(name, "gpu-operator") else None
    assert pod.get("nodeSelector") == selector
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod.get("runtimeClassName") == (None if _has(name, "gke") else "nvidia")
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )


def test_probes_and_ports_match_the_exporter(target):
    name, objs = target
    c = _container(objs)
    env = _env(c)
    port = parse_address(env.get("DCGM_EXPORTER_LISTEN", DEFAULT_ADDRESS), "env")[1]
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    tls = "DCGM_EXPORTER_WEB_CONFIG_FILE" in env
    assert tls == _has(name, "tls")
    served = _served_paths()
    for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and path in served
        assert get["port"] in ("metrics", port)
        assert get.get("scheme", "HTTP") == ("HTTPS" if tls else "HTTP")
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_service_and_servicemonitor_agree(target):
    name, objs = target
    c = _container(objs)
    svc = _one(objs, "Service")
    (port,) = svc["spec"]["ports"]
    assert port == {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}
    assert port["targetPort"] in {p["name"] for p in c["ports"]}
    assert svc["spec"]["selector"].items() <= _pod(objs)["metadata"]["labels"].items()
    if name == NO_OPERATOR:
        return  # scraped by deploy/prometheus/scrape-config.yaml: test_annotation_scrape.py
    sm = _one(objs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == port["name"]
    assert ep["path"] == "/metrics" and ep["path"] in _served_paths()
    assert ep.get("scheme", "http") == ("https" if _has(name, "tls") else "http")

    def seconds(d: str) -> int:
        return int(d[:-1]) * {"s": 1, "m": 60}[d[-1]]

    assert seconds(ep["scrapeTimeout"]) <= seconds(ep["interval"])
    assert ep["honorLabels"] is True
    node = {
        "action": "replace",
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
    }
    assert node in ep["relabelings"]
    drop = [r for r in ep["relabelings"] if r["action"] == "labeldrop"]
    assert [set(r["regex"].split("|")) for r in drop] == [{"pod", "namespace", "container"}]


def test_pod_resources_socket_is_mounted_where_the_exporter_looks(target):
    _, objs = target
    c = _container(objs)
    socket = Path(_env(c)["DCGM_POD_RESOURCES_KUBELET_SOCKET"])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[str(socket.parent)]["readOnly"] is True
    vols = {v["name"]: v for v in _pod(objs)["spec"]["volumes"]}
    assert vols[mounts[str(socket.parent)]["name"]]["hostPath"]["path"] == str(socket.parent)


def test_environment_variables_are_the_exporters(target):
    _, objs = target
    from exporter.config.dcgmflags import DCGM_FLAGS

    # this exporter's own variables, read where its flags are resolved
    files = [ROOT / "exporter" / "cli.py", *sorted((ROOT / "exporter" / "config").glob("*.py"))]
    cli = "".join(f.read_text() for f in files)
    dcgm = {f.env for f in DCGM_FLAGS}  # dcgm-exporter's, with its flags
    for name in _env(_container(objs)):
        if name.startswith(("DCGM_", "GPU_EXPORTER_")):
            assert name in dcgm or f'"{name}"' in cli, f"{name} is not read by the exporter"


def test_image_is_this_version(target):
    _, objs = target
    image = _container(objs)["image"]
    assert image.rsplit(":", 1)[1] == __version__
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG VERSION={__version__}\n" in dockerfile


# Components


def test_kube_prometheus_stack_labels(target):
    name, objs = target
    for o in objs:
        assert "release" not in o["metadata"].get("labels", {}) or o["apiVersion"].startswith(
            OPERATOR_GROUP
        )
    for kind in ("ServiceMonitor", "PrometheusRule") if name != NO_OPERATOR else ():
        labels = _one(objs, kind)["metadata"]["labels"]
        assert (labels.get("release") == "kube-prometheus-stack") == _has(
            name, "kube-prometheus-stack"
        )


def test_shared_gpus_sees_host_processes(rendered):
    for name in ("shared-gpus", "all", "moved"):
        pod = _pod(rendered[name])["spec"]
        c = _container(rendered[name])
        proc = next(v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/proc")
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == proc["name"]]
        assert mount["readOnly"] is True
        assert _env(c)["GPU_EXPORTER_HOST_PROC"] == mount["mountPath"]
        assert pod["hostPID"] is True


def test_tls_mounts_the_web_config_and_its_certificates(rendered):
    source = (DEPLOY / "components" / "tls" / "web-config.yaml").read_bytes()
    for name in ("tls", "all"):
        objs = rendered[name]
        c = _container(objs)
        path = Path(_env(c)["DCGM_EXPORTER_WEB_CONFIG_FILE"])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
        (vol,) = [v for v in _pod(objs)["spec"]["volumes"] if v["name"] == mount["name"]]
        files = {}
        secrets = {s["metadata"]["name"]: s for s in _kind(objs, "Secret")}
        for src in vol["projected"]["sources"]:
            ref = src["secret"]
            items = ref.get("items") or [
                {"key": k, "path": k} for k in secrets[ref["name"]]["data"]
            ]
            files |= {i["path"]: ref["name"] for i in items}
        assert files[path.name] == "gpu-exporter-web-config"
        assert {files[f] for f in ("tls.crt", "tls.key", "ca.crt")} == {"gpu-exporter-tls"}
        data = secrets["gpu-exporter-web-config"]["data"][path.name]
        assert base64.b64decode(data) == source
        config = yaml.safe_load(source)["tls_server_config"]
        assert {config["cert_file"], config["key_file"]} <= files.keys()  # relative to the file
        ep = _one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
        svc = _one(objs, "Service")["metadata"]
        assert ep["tlsConfig"]["serverName"] == f"{svc['name']}.{svc['namespace']}.svc"
        assert ep["tlsConfig"]["ca"]["secret"] == {"name": "gpu-exporter-tls", "key": "ca.crt"}
