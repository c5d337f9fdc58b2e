"""TLS from a web config, end to end: the real exporter, a real TLS client (Python's ssl, OpenSSL).

Each test starts the exporter on the default simulated node with its own certificates and
checks what a client sees: which CA verifies the server, whether client certificates are
required, and that a certificate written over the old one is served without a restart.
"""

from __future__ import annotations

import http.client
import signal
import ssl
import time
from pathlib import Path

import bcrypt
import pytest

from exporter.http import webconfig
from tests.procs import Prometheus, require, wait_until
from tests.support.certs import CA
from tests.support.client import get, start, tls_context

SERVER_ONLY = """\
tls_server_config:
  cert_file: tls.crt
  key_file: tls.key
"""
MUTUAL = """\
tls_server_config:
  cert_file: tls.crt
  key_file: tls.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: clients.crt
"""


@pytest.fixture
def pki(tmp_path: Path):
    """A folder with a server certificate from CA "servers", and the CA files."""
    servers, clients, other = CA("servers"), CA("clients"), CA("other")
    servers.issue("gpu-exporter", server=True).write(tmp_path, "tls.crt", "tls.key")
    (tmp_path / "servers.crt").write_bytes(servers.pem)
    (tmp_path / "clients.crt").write_bytes(clients.pem)
    (tmp_path / "other.crt").write_bytes(other.pem)
    clients.issue("prometheus", server=False).write(tmp_path, "prom.crt", "prom.key")
    other.issue("prometheus", server=False).write(tmp_path, "stranger.crt", "stranger.key")
    return {"dir": tmp_path, "servers": servers, "clients": clients, "other": other}


def _exporter(pki, text: str):
    path = pki["dir"] / "web-config.yaml"
    path.write_text(text)
    ctx = tls_context(pki["dir"] / "servers.crt")
    if "client_auth_type" in text:
        d = pki["dir"]
        ctx = tls_context(d / "servers.crt", (d / "prom.crt", d / "prom.key"))
    return start(path, ctx)


def test_right_ca_succeeds_and_wrong_ca_fails(pki):
    exp = _exporter(pki, SERVER_ONLY)
    try:
        status, _, body, _ = get(exp.port, "/metrics", tls_context(pki["dir"] / "servers.crt"))
        assert status == 200
        assert b"DCGM_FI_DEV_GPU_TEMP{" in body
        with pytest.raises(ssl.SSLCertVerificationError):
            get(exp.port, "/metrics", tls_context(pki["dir"] / "other.crt"))
        with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP: no answer
            get(exp.port, "/metrics")
    finally:
        exp.stop()


def test_probes_work_like_the_kubelets(pki):
    """The kubelet speaks HTTPS without verifying the certificate, and sends no credentials."""
    exp = _exporter(pki, SERVER_ONLY)
    try:
        kubelet = tls_context(None)
        assert get(exp.port, "/health", kubelet)[0] == 200
        assert get(exp.port, "/ready", kubelet)[0] == 200
    finally:
        exp.stop()


def test_mutual_tls(pki):
    d = pki["dir"]
    exp = _exporter(pki, MUTUAL)
    try:
        good = tls_context(d / "servers.crt", (d / "prom.crt", d / "prom.key"))
        assert get(exp.port, "/metrics", good)[0] == 200
        for ctx in (
            tls_context(d / "servers.crt"),  # no client certificate
            tls_context(d / "servers.crt", (d / "stranger.crt", d / "stranger.key")),  # wrong CA
        ):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                get(exp.port, "/metrics", ctx)
    finally:
        exp.stop()


def test_rotated_certificate_is_served_after_the_files_change(pki):
    d = pki["dir"]
    exp = _exporter(pki, SERVER_ONLY)
    try:
        before = get(exp.port, "/metrics", tls_context(d / "servers.crt"))[3]
        renewed = CA("servers-2026")
        (d / "renewed.crt").write_bytes(renewed.pem)
        new = renewed.issue("gpu-exporter", server=True)
        new.write(d, "tls.crt", "tls.key")  # no signal: the exporter notices by itself

        def served() -> bool:
            try:
                return get(exp.port, "/ready", tls_context(d / "renewed.crt"))[3] == new.fingerprint
            except (OSError, ssl.SSLError):
                return False

        wait_until(served, webconfig.POLL_S * 3, "the renewed certificate", interval=0.2)
        assert before != new.fingerprint
        with pytest.raises(ssl.SSLCertVerificationError):
            get(exp.port, "/ready", tls_context(d / "servers.crt"))
        assert exp.proc.poll() is None  # same process: no restart
    finally:
        exp.stop()


def test_client_ca_rotation_drops_the_old_ca(pki):
    d = pki["dir"]
    exp = _exporter(pki, MUTUAL)
    try:
        old_client = tls_context(d / "servers.crt", (d / "prom.crt", d / "prom.key"))
        new_client = tls_context(d / "servers.crt", (d / "stranger.crt", d / "stranger.key"))
        assert get(exp.port, "/ready", old_client)[0] == 200
        (d / "clients.crt").write_bytes(pki["other"].pem)
        exp.proc.send_signal(signal.SIGHUP)

        def rotated() -> bool:
            try:
                return get(exp.port, "/ready", new_client)[0] == 200
            except (OSError, ssl.SSLError):
                return False

        wait_until(rotated, 10, "the new client CA", interval=0.1)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(exp.port, "/ready", old_client)
    finally:
        exp.stop()


def test_bad_file_keeps_the_last_good_one_and_says_why(pki):
    d = pki["dir"]
    exp = _exporter(pki, SERVER_ONLY)
    ctx = tls_context(d / "servers.crt")
    try:
        first = get(exp.port, "/ready", ctx)[3]
        # a certificate that does not match its key, then a file that is not a web config
        pki["servers"].issue("other", server=True).write(d, "tls.crt", "unused.key")
        exp.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert get(exp.port, "/ready", ctx)[3] == first
        (d / "web-config.yaml").write_text("tls_server_config:\n  cert_fil: tls.crt\n")
        exp.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        status, _, _, peer = get(exp.port, "/metrics", ctx)
        assert (status, peer) == (200, first)
    finally:
        log = exp.stop()
    assert "cannot load cert_file" in log and "still serving with the last good web config" in log
    assert "unknown field(s) cert_fil" in log


def test_switching_to_plain_http_needs_a_restart(pki):
    d = pki["dir"]
    exp = _exporter(pki, SERVER_ONLY)
    try:
        (d / "web-config.yaml").write_text("basic_auth_users: {}\n")
        exp.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert get(exp.port, "/ready", tls_context(d / "servers.crt"))[0] == 200
    finally:
        log = exp.stop()
    assert "switching between HTTP and HTTPS needs a restart" in log


def test_client_allowed_sans(pki):
    d = pki["dir"]
    clients = pki["clients"]
    # the client the test waits with, and the allowed one
    prom = clients.issue("p", server=False, dns=("prometheus.monitoring.svc",))
    prom.write(d, "prom.crt", "prom.key")
    clients.issue("q", server=False, dns=("grafana.monitoring.svc",)).write(d, "no.crt", "no.key")
    exp = _exporter(pki, MUTUAL + "  client_allowed_sans: [prometheus.monitoring.svc]\n")
    try:
        allowed = tls_context(d / "servers.crt", (d / "prom.crt", d / "prom.key"))
        other = tls_context(d / "servers.crt", (d / "no.crt", d / "no.key"))
        assert get(exp.port, "/metrics", allowed)[0] == 200
        assert get(exp.port, "/metrics", other)[0] == 403
    finally:
        exp.stop()


def test_prometheus_scrapes_over_mutual_tls_with_basic_auth(pki, tmp_path_factory):
    """The client that matters: a real Prometheus (Go's crypto/tls), with the right CA and
    client certificate, and with a wrong CA."""
    require("prometheus", "prometheus")
    d = pki["dir"]
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    exp = _exporter(pki, MUTUAL + f"basic_auth_users:\n  prometheus: {hashed}\n")
    work = tmp_path_factory.mktemp("prom-tls")

    def job(name: str, ca: Path) -> str:
        return (
            f"  - job_name: {name}\n"
            "    scheme: https\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exp.port}']}}]\n"
            "    basic_auth: {username: prometheus, password: s3cret}\n"
            f"    tls_config: {{ca_file: {ca}, cert_file: {d / 'prom.crt'}, "
            f"key_file: {d / 'prom.key'}}}\n"
        )

    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
        + job("right-ca", d / "servers.crt")
        + job("wrong-ca", d / "other.crt")
    )
    prom = Prometheus(config, work)
    try:
        wait_until(lambda: prom.query('up{job="right-ca"} == 1'), 30, "a scrape over mutual TLS")
        wait_until(lambda: prom.query('up{job="wrong-ca"} == 0'), 30, "the wrong CA to fail")
        assert prom.query('DCGM_FI_DEV_GPU_TEMP{job="right-ca"}')
    finally:
        prom.stop()
        exp.stop()
