"""The API server's credentials (a token, a password, a client key, a password in the
server URL) appear in no repr or str of the kube configuration and client objects, in no
error message they raise and in no log line, even when the API server echoes what it
was sent."""

from __future__ import annotations

import base64
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exporter.workloads.apiserver import kubeconfig
from exporter.workloads.apiserver.apiclient import ApiClient, ApiError, ConnectError
from exporter.workloads.apiserver.kubeconfig import ClusterConfig, KubeConfigError
from exporter.workloads.apiserver.watch import PodWatcher
from tests.workloads.apiserver.test_watch import FAST, wait_until

TOKEN = "tok-5ecret-AAAA"
PASSWORD = "pw-5ecret-BBBB"
URL_PASSWORD = "url-5ecret-CCCC"
KEY = "key-5ecret-DDDD"
KEY_PEM = f"-----BEGIN PRIVATE KEY-----\n{KEY}\n-----END PRIVATE KEY-----\n"
BASIC = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
SECRETS = [TOKEN, PASSWORD, URL_PASSWORD, BASIC, KEY]


def leaks(*texts: object) -> list[str]:
    """The secrets found in ``texts`` (their str)."""
    return [s for s in SECRETS for t in texts if s in str(t)]


def kubeconfig_file(tmp_path: Path, user: str, server: str = "https://10.0.0.1:6443") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return str(path)


@pytest.fixture(params=["token", "basic", "key", "url"])
def config(request, tmp_path) -> ClusterConfig:
    pem = base64.b64encode(KEY_PEM.encode()).decode()
    user = {
        "key": f"{{client-certificate-data: {pem}, client-key-data: {pem}}}",
        "token": f"{{token: {TOKEN}}}",
        "basic": f"{{username: admin, password: {PASSWORD}}}",
        "url": "{}",
    }[request.param]
    server = f"https://admin:{URL_PASSWORD}@10.0.0.1:6443" if request.param == "url" else None
    return kubeconfig.from_kubeconfig(kubeconfig_file(tmp_path, user, *filter(None, [server])))


def test_config_and_client_objects_show_no_secret(config):
    assert leaks(config.token, config.password, config.key_data, config.server)  # present
    try:
        client: object = ApiClient(config)
    except KubeConfigError as e:  # the client key: not a key, and the error says so
        assert "client certificate and key do not load" in str(e)
        client = e
    assert not leaks(repr(config), str(config), repr(client), str(client), [config])
    assert "ClusterConfig(server=" in repr(config)


def test_error_messages_name_no_secret(tmp_path):
    errors: list[BaseException] = []
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    bad = [
        f"https://admin:{URL_PASSWORD}@", f"ftp://admin:{URL_PASSWORD}@h",
        f"https://admin:{URL_PASSWORD}@h:99999999",
    ]  # fmt: skip
    for server in bad:
        with pytest.raises(KubeConfigError) as e:
            ApiClient(ClusterConfig(server=server, token=TOKEN))
        errors.append(e.value)
    config = ClusterConfig(server=f"http://admin:{URL_PASSWORD}@127.0.0.1:{port}", token=TOKEN)
    with pytest.raises(ConnectError) as c:
        ApiClient(config).get("/api/v1/pods", timeout=(2, 2))
    errors.append(c.value)
    for user in (f'{{token: "{TOKEN}', f"{{password: {PASSWORD}, username: [a"):
        with pytest.raises(KubeConfigError) as k:  # YAML broken on the line of the secret
            kubeconfig.from_kubeconfig(kubeconfig_file(tmp_path, user))
        errors.append(k.value)
    token_file = tmp_path / "token"
    token_file.write_text(" \n")
    with pytest.raises(KubeConfigError) as t:
        kubeconfig.read_token(str(token_file))
    errors.append(t.value)
    assert len(errors) == 7
    assert not leaks(*errors, *(repr(e) for e in errors))


class Echo(BaseHTTPRequestHandler):
    """An API server that refuses every request, quoting its Authorization header in the
    status line and in a Kubernetes Status body."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization", "")
        body = f'{{"kind":"Status","message":"who is {auth}?"}}'.encode()
        self.send_response(401, f"Unauthorized {auth}")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "auth", [{"token": TOKEN}, {"username": "admin", "password": PASSWORD}], ids=["token", "basic"]
)
def test_an_api_server_echoing_the_credentials_gets_them_into_no_log(echo, auth, caplog):
    client = ApiClient(ClusterConfig(server=echo, **auth))
    with pytest.raises(ApiError) as e:
        client.get("/api/v1/pods")
    assert "who is" in e.value.body and "<redacted>" in e.value.body
    assert not leaks(e.value, e.value.reason, e.value.body)
    watcher = PodWatcher("node-a", api_client=client, timing=FAST)
    with caplog.at_level(logging.DEBUG, logger="exporter"):
        watcher.start()
        try:
            wait_until(lambda: "401" in watcher.status, what=lambda: watcher.status)
        finally:
            watcher.stop()
    logged = [r.getMessage() for r in caplog.records]
    assert any("who is" in line for line in logged)  # the server's message is logged ...
    assert not leaks(watcher.status, *logged)  # ... without the credentials
