"""The Helm chart (deploy/helm/gpu-exporter), rendered by real Helm (helm-python-sdk bundles Helm
v4 as a library): for each kustomize choice it renders the same objects as kustomize, lints
strict clean, its schema refuses wrong values naming them, its objects validate like
kustomize's, and a values file written for NVIDIA's dcgm-exporter chart works or says what to
use instead."""

from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter import __version__
from tests.deploy.conftest import COMPONENTS, DEPLOY, EXCLUSIVE, MOVED_NAMESPACE
from tests.deploy.test_manifests import (
    OPENSHIFT_GROUP,
    OPERATOR_GROUP,
    VERSIONS,
    _validator,
)
from tests.procs import ROOT

helm = pytest.importorskip("helm_python", reason="pip install -e '.[test]' (helm-python-sdk)")

CHART = DEPLOY / "helm" / "gpu-exporter"
RELEASE = "gpu-exporter"
NAMESPACE = "gpu-exporter"
# Labels only Helm adds (the release's and the chart's); everything else must be equal.
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
# Each kustomize component as chart values.
COMPONENT_VALUES: dict[str, dict[str, Any]] = {
    "aks": {"aks": {"enabled": True}},
    "dra": {"dra": {"enabled": True}},
    "extended-metrics": {"extendedMetrics": {"enabled": True}},
    "gke": {"gke": {"enabled": True}},
    "gpu-operator": {"gpuOperator": {"enabled": True}},
    "kube-prometheus-stack": {
        "serviceMonitor": {"additionalLabels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"additionalLabels": {"release": "kube-prometheus-stack"}},
    },
    "openshift": {"openshift": {"enabled": True}},
    "privileged-xids": {"privilegedXids": {"enabled": True}},
    "shared-gpus": {"sharedGpus": {"enabled": True}},
    "tls": {"tlsServerConfig": {"enabled": True}},
    "without-prometheus-operator": {
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
    },
}


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


COMBINED = _merge(*(COMPONENT_VALUES[c] for c in COMPONENTS if c not in EXCLUSIVE))
# kustomize target (conftest.TARGETS) -> (chart values, namespace)
CHOICES: dict[str, tuple[dict[str, Any], str]] = {
    "base": ({}, NAMESPACE),
    **{name: (values, NAMESPACE) for name, values in COMPONENT_VALUES.items()},
    "existing-namespace": ({}, MOVED_NAMESPACE),
    "all": (_merge(COMBINED, {"namespace": {"create": True}}), NAMESPACE),
    "moved": (COMBINED, MOVED_NAMESPACE),
}


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text."""
    chart = helm.Chart.load(str(CHART))
    try:
        return chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    finally:
        chart.close()


def objects(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict]:
    out = render(values, namespace)
    return [
        d
        for path, text in sorted(out.items())
        if path.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]


def _normal(value: Any) -> Any:
    """Without Helm's own labels, lists of objects in a stable order (env, volumes, terms and
    tolerations mean the same in any order; kustomize's patches prepend); strings lists
    (args, verbs) keep theirs."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if k not in HELM_LABELS}
    if isinstance(value, list):
        items = [_normal(v) for v in value]
        if items and all(isinstance(v, dict) for v in items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    return value


def _decoded(o: dict[str, Any]) -> dict[str, Any]:
    """A Secret with its data decoded (kustomize wraps base64 at 70 columns, Helm does not)."""
    if o["kind"] != "Secret":
        return o
    return o | {"data": {k: base64.b64decode("".join(v.split())) for k, v in o["data"].items()}}


def _keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {(o["kind"], o["metadata"]["name"]): _normal(_decoded(o)) for o in objs}
    assert len(out) == len(objs), "two objects of one kind and name"
    return out


@pytest.fixture(scope="module", params=sorted(CHOICES))
def choice(request, rendered):
    values, namespace = CHOICES[request.param]
    return request.param, rendered[request.param], objects(values, namespace)


def test_every_kustomize_choice_has_values():
    assert set(COMPONENT_VALUES) == set(COMPONENTS)


def test_chart_renders_what_kustomize_renders(choice):
    """Kinds, names, containers, args, env, volumes, probes, security contexts, RBAC: all of
    every object, less the labels only Helm adds."""
    name, kustomized, charted = choice
    want, got = _keyed(kustomized), _keyed(charted)
    monitor = want.get(("ServiceMonitor", "gpu-exporter"), {})
    for endpoint in monitor.get("spec", {}).get("endpoints", []):
        if "tlsConfig" in endpoint and CHOICES[name][1] != NAMESPACE:
            # kustomize's namespace setting does not reach this string: in another namespace
            # the user sets serverName (docs/deploy.md); the chart follows the namespace.
            assert endpoint["tlsConfig"]["serverName"] == f"gpu-exporter.{NAMESPACE}.svc"
            endpoint["tlsConfig"]["serverName"] = f"gpu-exporter.{CHOICES[name][1]}.svc"
    assert sorted(got) == sorted(want), name
    for key in want:
        assert got[key] == want[key], (name, key)


def test_chart_objects_validate_strictly(choice):
    """kubernetes-validate's offline schemas and the Prometheus Operator CRDs, as
    test_manifests.py checks kustomize's output."""
    _, _, objs = choice
    for o in objs:
        if o["apiVersion"].startswith(OPENSHIFT_GROUP):
            continue
        if o["apiVersion"].startswith(OPERATOR_GROUP):
            continue  # below
        for version in (VERSIONS[0], VERSIONS[-1]):
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{o['kind']}/{o['metadata']['name']} on Kubernetes {version}: {e}")


def test_chart_operator_objects_validate_against_their_crds(choice, crds):
    _, _, objs = choice
    for o in objs:
        if o["apiVersion"] == f"{OPERATOR_GROUP}/v1":
            body = copy.deepcopy(o)
            body["metadata"] = {}
            _validator(crds[o["kind"]]).validate(body)


@pytest.mark.parametrize("choice_name", sorted(CHOICES))
def test_lint_strict_is_clean(choice_name):
    values, namespace = CHOICES[choice_name]
    report = helm.lint(str(CHART), values, strict=True, namespace=namespace)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_lint_reports_a_broken_chart(tmp_path):
    broken = tmp_path / "gpu-exporter"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "service.yaml").write_text("{{ .Values.nope.nope }}\n")
    report = helm.lint(str(broken), strict=True)
    assert report["errors"], report


# The schema


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"collectInterval": "fast"}, "/collectInterval"),
        ({"serviceMonitor": {"enabled": "yes"}}, "/serviceMonitor/enabled"),
        ({"serviceMonitor": {"interval": 30}}, "/serviceMonitor/interval"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"image": {"repository": ""}}, "/image/repository"),
        ({"tolerations": {"key": "x"}}, "/tolerations"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"dra": True}, "/dra"),
        ({"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
        ({"kubeletPath": "var/lib/kubelet"}, "/kubeletPath"),
        ({"tlsServerConfig": {"enabeld": True}}, "enabeld"),
        ({"sharedGPUs": {"enabled": True}}, "sharedGPUs"),
    ],
)
def test_schema_refuses_a_wrong_value_naming_it(values, named):
    with pytest.raises(helm.HelmValuesError) as e:
        render(values)
    assert named in str(e.value)


def test_schema_is_valid_json_schema_and_accepts_the_defaults():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))
    for values, _ in CHOICES.values():
        jsonschema.Draft7Validator(schema).validate(values)


# Versions and the image


def test_chart_version_and_image_follow_the_exporters_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    (ds,) = [o for o in objects() if o["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (entry,) = base["images"]
    assert image == f"{entry['newName']}:{entry['newTag']}" == f"{entry['newName']}:{__version__}"


def test_image_by_digest_and_tag():
    digest = "sha256:" + "ab" * 32
    for values, want in (
        ({"image": {"tag": "9.9.9"}}, "ghcr.io/x/y:9.9.9"),
        ({"image": {"digest": digest}}, f"ghcr.io/x/y@{digest}"),
    ):
        values["image"]["repository"] = "ghcr.io/x/y"
        (ds,) = [o for o in objects(values) if o["kind"] == "DaemonSet"]
        assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == want


# Values only the chart has (kustomize users patch these themselves)


def _container(objs):
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"], ds["spec"]["template"]["spec"]["containers"][0]


def test_metrics_csv_and_config_file_are_configmaps_the_exporter_reads():
    csv = "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
    config = {"version": 2}
    objs = objects({"metricsCsv": csv, "configFile": config})
    pod, c = _container(objs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    maps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for variable, volume, key, content in (
        ("DCGM_EXPORTER_COLLECTORS", "metrics", "metrics.csv", csv),
        ("DCGM_EXPORTER_CONFIG_FILE", "config", "config.yaml", None),
    ):
        path = Path(env[variable])
        assert str(path.parent) == mounts[volume] and path.name == key
        data = maps[volumes[volume]["configMap"]["name"]]["data"][key]
        assert data == content if content else yaml.safe_load(data) == config
    for o in objs:
        if not o["apiVersion"].startswith((OPERATOR_GROUP, OPENSHIFT_GROUP)):
            kubernetes_validate.validate(o, VERSIONS[-1], strict=True)


def test_arguments_env_resources_priority_and_pull_secrets():
    objs = objects(
        {
            "arguments": ["-o", "--kubernetes-pod-labels", "team"],
            "extraEnv": [{"name": "GPU_EXPORTER_ACCOUNTING_IDLE_THRESHOLD", "value": "5"}],
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            "priorityClassName": "",
            "imagePullSecrets": [{"name": "pull"}],
            "podAnnotations": {"a": "b"},
        }
    )
    pod, c = _container(objs)
    assert c["args"] == ["-o", "--kubernetes-pod-labels", "team"]
    assert {"name": "GPU_EXPORTER_ACCOUNTING_IDLE_THRESHOLD", "value": "5"} in c["env"]
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}}
    assert "priorityClassName" not in pod
    assert pod["imagePullSecrets"] == [{"name": "pull"}]


def test_basic_auth_users_are_bcrypt_in_the_web_config():
    import bcrypt

    objs = objects(
        {
            "tlsServerConfig": {"enabled": True},
            "basicAuth": {
                "users": {"prometheus": "s3cret", "hashed": "$2b$10$abcdefghijklmnopqrstuv"}
            },
        }
    )
    (secret,) = [o for o in objs if o["kind"] == "Secret"]
    config = yaml.safe_load(base64.b64decode(secret["data"]["web-config.yaml"]))
    assert config["tls_server_config"]["cert_file"] == "tls.crt"
    users = config["basic_auth_users"]
    assert bcrypt.checkpw(b"s3cret", users["prometheus"].encode())
    assert users["hashed"] == "$2b$10$abcdefghijklmnopqrstuv"


def test_basic_auth_without_tls_is_refused():
    with pytest.raises(helm.HelmRenderError, match=r"basicAuth\.users"):
        render({"basicAuth": {"users": {"a": "b"}}})


def test_notes_say_how_to_reach_metrics_and_the_dashboards():
    notes = render()["gpu-exporter/templates/NOTES.txt"]
    assert "port-forward daemonset/gpu-exporter 9400" in notes
    assert "/metrics" in notes and "grafana_dashboard" in notes
    tls = render({"tlsServerConfig": {"enabled": True}})["gpu-exporter/templates/NOTES.txt"]
    assert "https://localhost:9400/metrics" in tls


# Coming from NVIDIA's dcgm-exporter chart

DCGM_VALUES = ROOT / "tests" / "fixtures" / "helm" / "dcgm-exporter-values.yaml"


def test_dcgm_exporter_values_work():
    """Its common keys, as a user of that chart writes them, render a valid exporter."""
    values = yaml.safe_load(DCGM_VALUES.read_text())
    objs = objects(values)
    pod, c = _container(objs)
    assert c["image"] == "registry.example.com/gpu-exporter:0.1.0"
    assert c["args"] == values["arguments"]
    assert {"name": "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "value": "true"} in c["env"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    # merged over the chart's (Helm merges maps): theirs added, read-only root kept
    assert c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert c["securityContext"]["runAsUser"] == 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    socket = next(e for e in c["env"] if e["name"] == "DCGM_POD_RESOURCES_KUBELET_SOCKET")
    assert socket["value"] == values["kubeletPath"] + "/kubelet.sock"
    (sm,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["endpoints"][0]["scheme"] == "https"
    (secret,) = [o for o in objs if o["kind"] == "Secret"]
    assert "basic_auth_users" in yaml.safe_load(base64.b64decode(secret["data"]["web-config.yaml"]))
    for o in objs:
        if not o["apiVersion"].startswith((OPERATOR_GROUP, OPENSHIFT_GROUP)):
            kubernetes_validate.validate(o, VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("key", "value", "instead"),
    [
        ("hostNetwork", True, "not needed"),
        ("mapPodsMetrics", True, "kubernetes"),
        ("service", {"port": 9401}, "-a"),
        ("serviceAccount", {"create": True}, "not needed"),
        ("customMetrics", "DCGM_FI_DEV_GPU_TEMP, gauge, t", "metricsCsv"),
        ("affinity", {}, "nodeSelector"),
        ("extraHostVolumes", [], "sharedGpus.enabled"),
        ("extraConfigMapVolumes", [], "metricsCsv"),
        ("extraVolumeMounts", [], "metricsCsv"),
        ("rollingUpdate", {}, "not needed"),
        ("kubernetesDRA", {"enabled": True}, "dra.enabled"),
    ],
)
def test_dcgm_exporter_values_that_differ_say_what_to_use(key, value, instead):
    with pytest.raises(helm.HelmRenderError) as e:
        render({key: value})
    message = str(e.value)
    assert f'value "{key}"' in message and instead in message
    assert message.count(f'value "{key}"') == 1  # one message, not one per template


def test_deploy_doc_maps_every_dcgm_exporter_key():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    section = doc.split("## Coming from dcgm-exporter's chart", 1)[1].split("\n## ", 1)[0]
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"].items()
    theirs = {k for k, v in props if "dcgm-exporter" in v.get("description", "")}
    common = set(yaml.safe_load(DCGM_VALUES.read_text()))
    for key in theirs | common:
        assert f"`{key}`" in section, key
