"""The API client over real HTTPS on 127.0.0.1: CA checks, client certificates,
tokens that rotate, error answers, broken and blocked reads."""

from __future__ import annotations

import base64
import http.client
import json
import threading

import pytest

pytest.importorskip("cryptography", reason="certificates for the TLS tests are made with it")

from exporter.workloads.apiserver.apiclient import ApiClient, ApiError, ConnectError
from exporter.workloads.apiserver.kubeconfig import ClusterConfig, KubeConfigError
from exporter.workloads.apiserver.reflector import _describe, default_api_client, lines, read_json
from tests.workloads.apiserver.tlsapi import TLSAPIServer, cert_pem, issue, key_pem


@pytest.fixture(scope="module")
def ca():
    return issue("test CA")


@pytest.fixture
def api(tmp_path, ca):
    with TLSAPIServer(tmp_path, ca) as srv:
        yield srv


def tls(url, ca, **kw):
    return ApiClient(ClusterConfig(server=url, source="kubeconfig /k", ca_data=cert_pem(ca), **kw))


def test_https_with_the_cluster_ca_and_a_token(api, ca):
    body = read_json(tls(api.url, ca, token="s3cret").get("/ok"))
    assert body == {"kind": "APIGroup", "name": "ok"}
    assert api.auth == ["Bearer s3cret"]


def test_a_server_certificate_of_another_ca_is_refused_clearly(api):
    other = issue("someone else")
    with pytest.raises(ConnectError) as e:
        tls(api.url, other).get("/ok")
    msg = _describe(e.value)
    assert msg.startswith(f"cannot connect to {api.url}: TLS certificate not trusted")
    assert "check the certificate authority in kubeconfig /k" in msg
    assert api.auth == []  # no token was sent to it


def test_tls_server_name_picks_the_name_checked(tmp_path, ca):
    with TLSAPIServer(tmp_path, ca, sans=("kubernetes.default.svc",)) as srv:
        with pytest.raises(ConnectError, match="not trusted"):
            tls(srv.url, ca).get("/ok")
        client = tls(srv.url, ca, tls_server_name="kubernetes.default.svc")
        assert read_json(client.get("/ok"))["name"] == "ok"


def test_insecure_skip_tls_verify(api):
    client = ApiClient(ClusterConfig(server=api.url, insecure=True))
    assert read_json(client.get("/ok"))["name"] == "ok"


def test_client_certificate_authenticates(tmp_path, ca):
    client_ca = issue("client CA")
    me = issue("system:node:gpu-1", client_ca)
    with TLSAPIServer(tmp_path, ca, client_ca=client_ca) as srv:
        client = tls(srv.url, ca, cert_data=cert_pem(me), key_data=key_pem(me))
        assert read_json(client.get("/ok"))["name"] == "ok"
        assert srv.clients == ["system:node:gpu-1"]
        with pytest.raises((OSError, http.client.HTTPException)):
            read_json(tls(srv.url, ca).get("/ok"))  # no certificate: the server hangs up


def test_client_certificate_from_files(tmp_path, ca):
    client_ca = issue("client CA")
    me = issue("exporter", client_ca)
    (tmp_path / "me.crt").write_bytes(cert_pem(me))
    (tmp_path / "me.key").write_bytes(key_pem(me))
    (tmp_path / "ca.crt").write_bytes(cert_pem(ca))
    cfg = ClusterConfig(
        server="https://127.0.0.1:1",
        ca_file=str(tmp_path / "ca.crt"),
        cert_file=str(tmp_path / "me.crt"),
        key_file=str(tmp_path / "me.key"),
    )
    with TLSAPIServer(tmp_path, ca, client_ca=client_ca) as srv:
        client = ApiClient(ClusterConfig(**{**_fields(cfg), "server": srv.url}))
        assert read_json(client.get("/ok"))["name"] == "ok"
        assert srv.clients == ["exporter"]


def test_a_key_that_does_not_match_is_a_configuration_error(ca):
    a, b = issue("a", ca), issue("b", ca)
    with pytest.raises(KubeConfigError, match="client certificate and key do not load"):
        tls("https://127.0.0.1:1", ca, cert_data=cert_pem(a), key_data=key_pem(b))


def test_basic_auth(api, ca):
    read_json(tls(api.url, ca, username="admin", password="pa:ss").get("/ok"))
    assert api.auth == ["Basic " + base64.b64encode(b"admin:pa:ss").decode()]


def test_a_rotated_token_is_picked_up(api, ca, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [0.0]
    cfg = ClusterConfig(server=api.url, ca_data=cert_pem(ca), token_file=str(token))
    client = ApiClient(cfg, token_refresh_s=60, clock=lambda: now[0])
    read_json(client.get("/ok"))
    token.write_text("second\n")
    now[0] = 59.0
    read_json(client.get("/ok"))
    now[0] = 60.0
    read_json(client.get("/ok"))
    token.unlink()  # mid-rotation: the last token is used until a new one is there
    now[0] = 200.0
    read_json(client.get("/ok"))
    assert api.auth == ["Bearer first", "Bearer first", "Bearer second", "Bearer second"]


def test_in_cluster_from_a_service_account_dir(api, ca, tmp_path, monkeypatch):
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_bytes(cert_pem(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    client = default_api_client(str(tmp_path))
    assert read_json(client.get("/ok"))["name"] == "ok"
    assert api.auth == ["Bearer pod-token"]


@pytest.mark.parametrize(
    "code, reason, text",
    [
        (401, "Unauthorized", "HTTP 401 Unauthorized: said 401 (needs get, list and watch"),
        (403, "Forbidden", "HTTP 403 Forbidden: said 403 (needs get, list and watch"),
        (410, "Gone", "HTTP 410 Gone: said 410"),
        (500, "Internal Server Error", "HTTP 500 Internal Server Error: said 500"),
    ],
)
def test_error_answers(api, ca, code, reason, text):
    with pytest.raises(ApiError) as e:
        tls(api.url, ca).get(f"/status/{code}")
    assert (e.value.status, e.value.reason) == (code, reason)
    assert json.loads(e.value.body)["message"] == f"said {code}"
    assert _describe(e.value).startswith(text)


def test_a_watch_cut_mid_line_breaks_without_the_half_line(api, ca):
    got = []
    with pytest.raises(http.client.HTTPException) as e:
        for line in lines(tls(api.url, ca).get("/cut")):
            got.append(json.loads(line))
    assert got == [{"type": "ADDED"}]
    assert _describe(e.value).startswith("connection broken: ")


def test_abort_unblocks_a_read(api, ca):
    resp = tls(api.url, ca).get("/stall", timeout=(5, 60))
    outcome = []

    def read():
        try:
            outcome.append(list(resp.stream()))
        except (OSError, http.client.HTTPException) as e:
            outcome.append(e)

    t = threading.Thread(target=read)
    t.start()
    t.join(0.2)
    assert t.is_alive()  # blocked: the server sends nothing
    resp.abort()
    t.join(10)
    assert not t.is_alive() and outcome
    resp.close()


def test_a_read_timeout_says_so(api, ca):
    resp = tls(api.url, ca).get("/stall", timeout=(5, 0.2))
    with pytest.raises(TimeoutError) as e:
        resp.read(10)
    assert _describe(e.value) == "read timed out"


def test_nothing_listening_is_a_connection_error():
    with pytest.raises(ConnectError) as e:
        ApiClient(ClusterConfig(server="http://127.0.0.1:9")).get("/ok", timeout=(2, 2))
    assert "refused" in str(e.value).lower() and "127.0.0.1:9" in str(e.value)


def _fields(cfg):
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
