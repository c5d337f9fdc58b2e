"""Reading the API server's configuration: kubeconfig files (tests/fixtures/kubeconfig)
and the in-cluster service account."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.workloads.apiserver import kubeconfig
from exporter.workloads.apiserver.kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    from_kubeconfig,
    in_cluster,
)

FIX = Path(__file__).parents[2] / "fixtures" / "kubeconfig"


def test_current_context_with_a_ca_file_and_token():
    c = from_kubeconfig(str(FIX / "token.yaml"))
    assert c == ClusterConfig(
        server="https://10.0.0.1:6443",
        source=f"kubeconfig {FIX / 'token.yaml'}",
        ca_file=str(FIX / "certs" / "ca.crt"),  # relative to the kubeconfig
        tls_server_name="kubernetes.default.svc",
        token="abc.def.ghi",
    )


def test_inline_certificates_are_decoded():
    c = from_kubeconfig(str(FIX / "client-cert-data.yaml"))
    assert c.server == "https://127.0.0.1:40000"
    assert c.ca_data.startswith(b"-----BEGIN CERTIFICATE-----\n")
    assert c.cert_data == c.ca_data
    assert c.key_data.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert not (c.token or c.token_file or c.username or c.insecure)


def test_token_file_and_insecure():
    c = from_kubeconfig(str(FIX / "token-file-insecure.yaml"))
    assert c.insecure is True and c.token_file == "/var/run/secrets/tokens/exporter"


def test_basic_auth_over_http():
    c = from_kubeconfig(str(FIX / "basic-http.yaml"))
    assert (c.server, c.username, c.password) == ("http://127.0.0.1:8001", "admin", "p@ss:word")


@pytest.mark.parametrize(
    "fixture, message",
    [
        ("exec-plugin.yaml", "user 'eks-user' uses an exec plugin, which this exporter does "
         "not run; give it a token, tokenFile or client certificate"),
        ("auth-provider.yaml", "user 'gke-user' uses an auth-provider plugin"),
        ("no-current-context.yaml", "no current-context; set one with kubectl"),
        ("unknown-cluster.yaml", "no cluster named 'c' in clusters"),
        ("bad-base64.yaml", "certificate-authority-data is not valid base64"),
        ("aliases.yaml", "not valid YAML: YAML anchors and aliases (& and *) are not accepted"),
        ("no-server.yaml", "cluster 'c' has no https:// or http:// server"),
    ],
)  # fmt: skip
def test_unusable_kubeconfigs_say_why(fixture, message):
    path = FIX / fixture
    with pytest.raises(KubeConfigError) as e:
        from_kubeconfig(str(path))
    assert str(e.value).startswith(f"kubeconfig {path}: ")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_huge_or_special_file_is_refused(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(KubeConfigError, match="larger than 1 MiB"):
        from_kubeconfig(str(big))
    with pytest.raises(KubeConfigError, match="not a regular file"):
        from_kubeconfig("/dev/zero")


def service_account(tmp_path: Path, token: str = "t0ken") -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    (d / "token").write_text(token + "\n")
    (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return d


ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_in_cluster(tmp_path):
    d = service_account(tmp_path)
    c = in_cluster(str(d), ENV)
    assert c == ClusterConfig(
        server="https://10.96.0.1:443",
        source="in-cluster",
        ca_file=str(d / "ca.crt"),
        token_file=str(d / "token"),
    )
    v6 = in_cluster(str(d), {**ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert v6.server == "https://[fd00::1]:443"


def test_in_cluster_needs_the_environment_and_the_token(tmp_path):
    with pytest.raises(KubeConfigError, match=r"KUBERNETES_SERVICE_HOST and .* are not set"):
        in_cluster(str(service_account(tmp_path)), {})
    with pytest.raises(KubeConfigError, match="token is missing: is a service account token"):
        in_cluster(str(tmp_path / "nowhere"), ENV)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "token").write_text("\n")
    (empty / "ca.crt").write_text("x")
    with pytest.raises(KubeConfigError, match=r"token file .*: empty"):
        in_cluster(str(empty), ENV)


def test_in_cluster_comes_first_then_the_first_kubeconfig_of_the_list(tmp_path):
    d = service_account(tmp_path)
    first, second = FIX / "basic-http.yaml", FIX / "token.yaml"
    env = {"KUBECONFIG": f":{first}:{second}"}
    assert kubeconfig.load(str(d), {**env, **ENV}).source == "in-cluster"
    assert kubeconfig.load(str(d), env).server == "http://127.0.0.1:8001"


def test_nothing_usable_names_both_attempts(tmp_path):
    env = {"KUBECONFIG": str(FIX / "exec-plugin.yaml")}
    with pytest.raises(KubeConfigError) as e:
        kubeconfig.load(str(tmp_path), env)
    assert str(e.value).startswith(
        "no Kubernetes configuration: not in a cluster (KUBERNETES_SERVICE_HOST and "
        "KUBERNETES_SERVICE_PORT are not set) and no usable kubeconfig (kubeconfig "
    )
    assert "exec plugin" in str(e.value)
