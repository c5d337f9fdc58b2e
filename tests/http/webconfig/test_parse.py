"""The web config file: what loads, what is refused and why, and agreement with promtool.

`promtool check web-config` (exporter-toolkit's own validation) is the reference: the
shipped examples must pass it, and files it refuses are refused here too. The few things
exporter-toolkit accepts and the exporter cannot do are refused with a reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import bcrypt
import pytest

from exporter.cli import main
from exporter.http import webconfig
from tests.procs import ROOT, require
from tests.support.certs import CA

TLS_COMPONENT = ROOT / "deploy" / "components" / "tls"
EXAMPLES = [TLS_COMPONENT / "web-config.yaml", *sorted((TLS_COMPONENT / "examples").glob("*.yaml"))]
HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
TLS = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A folder with tls.crt, tls.key and ca.crt, as the TLS component mounts them."""
    d = tmp_path_factory.mktemp("certs")
    ca = CA("test")
    ca.issue("gpu-exporter", server=True).write(d, "tls.crt", "tls.key")
    (d / "ca.crt").write_bytes(ca.pem)
    return d


def _file(folder: Path, text: str) -> Path:
    path = folder / f"web-{abs(hash(text))}.yaml"
    path.write_text(text)
    return path


def _promtool(path: Path) -> subprocess.CompletedProcess:
    promtool = require("promtool", "prometheus")
    return subprocess.run(
        [promtool, "check", "web-config", str(path)], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_pass_promtool_and_load(example, certs):
    path = certs / example.name
    shutil.copy(example, path)
    p = _promtool(path)
    assert p.returncode == 0, p.stdout + p.stderr
    loaded = webconfig.load(str(path))
    assert loaded.context is not None
    assert loaded.config.tls is not None
    assert loaded.config.tls.cert_file == str(certs / "tls.crt")


GOOD = {
    "empty": "",
    "headers-only": "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n",
    "auth-only": f"basic_auth_users:\n  prometheus: {HASH}\n",
    "tls": TLS + "  min_version: TLS13\n",
    "verify-if-given": TLS
    + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n",
    "ciphers": TLS
    + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
    + "  prefer_server_cipher_suites: false\n",
    "http2-off": TLS + "http_server_config:\n  http2: false\n",
}
BAD = {
    "unknown-field": TLS + "web_listen: 1\n",
    "unknown-tls-field": TLS + "  cert_fil: x\n",
    "missing-key-file": "tls_server_config:\n  cert_file: tls.crt\n",
    "missing-cert-file": "tls_server_config:\n  key_file: tls.key\n",
    "cert-file-absent": "tls_server_config:\n  cert_file: nope.crt\n  key_file: tls.key\n",
    "cert-and-key-mismatch": "tls_server_config:\n  cert_file: tls.crt\n  key_file: other.key\n",
    "header-not-allowed": "http_server_config:\n  headers:\n    X-Powered-By: me\n",
    "header-value": "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
    "ca-without-client-auth": TLS + "  client_ca_file: ca.crt\n",
    "client-auth-type": TLS + "  client_auth_type: Sometimes\n",
    "tls-version": TLS + "  min_version: TLS14\n",
    "cipher": TLS + "  cipher_suites: [TLS_MADE_UP]\n",
    "plaintext-password": "basic_auth_users:\n  prometheus: hunter2\n",
    "sha256-password": "basic_auth_users:\n  prometheus: "
    "$5$rounds=5000$salt$Gbz2.Vdr9X8iHtI3ZKQ1G1HqPKZ2xU8Zm4yS5Y/4D9\n",
    "not-yaml": "tls_server_config: [\n",
}


@pytest.mark.parametrize("text", GOOD.values(), ids=GOOD.keys())
def test_accepted_by_both(text, certs):
    path = _file(certs, text)
    p = _promtool(path)
    assert p.returncode == 0, p.stdout + p.stderr
    webconfig.load(str(path))


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_refused_by_both(text, certs):
    other = CA("other").issue("x", server=True)
    (certs / "other.key").write_bytes(other.key_pem)
    path = _file(certs, text)
    p = _promtool(path)
    assert p.returncode != 0, f"promtool accepted:\n{text}"
    with pytest.raises(webconfig.WebConfigError) as e:
        webconfig.load(str(path))
    assert str(e.value).startswith(f"web config {path}: ")


DIFFERENCES = {
    "curve_preferences": (TLS + "  curve_preferences: [CurveP256]\n", "curve_preferences"),
    "RequireAnyClientCert": (
        TLS + "  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.crt\n",
        "RequireAndVerifyClientCert",
    ),
    "verify-without-ca": (
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n",
        "client_ca_file",
    ),
}


@pytest.mark.parametrize(("text", "hint"), DIFFERENCES.values(), ids=DIFFERENCES.keys())
def test_what_the_exporter_cannot_do_is_refused_with_a_reason(text, hint, certs):
    with pytest.raises(webconfig.WebConfigError, match=hint):
        webconfig.load(str(_file(certs, text)))


def test_bcrypt_variants_from_common_tools_are_accepted(certs):
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    for prefix in ("$2a$", "$2b$", "$2y$"):  # Go, Python, htpasswd
        text = f"basic_auth_users:\n  u: {prefix}{hashed[4:]}\n"
        assert webconfig.load(str(_file(certs, text))).config.users["u"].startswith(prefix.encode())


def _secret_volume(folder: Path, files: dict[str, bytes], version: str) -> None:
    """Lay out files as the kubelet mounts a Secret: ..data -> ..<version>/, name -> ..data/name."""
    real = folder / f"..{version}"
    real.mkdir()
    for name, data in files.items():
        (real / name).write_bytes(data)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(real.name)
    tmp.replace(folder / "..data")
    for name in files:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


async def test_secret_volumes_relative_paths_and_atomic_updates(tmp_path):
    """Paths resolve from the config file's folder as named, not from where its symlink
    points; a Secret update (an atomic swap of ..data) is seen as a change."""
    web, tls = tmp_path / "web", tmp_path / "tls"
    web.mkdir()
    tls.mkdir()
    ca = CA("one")
    first = ca.issue("a", server=True)
    _secret_volume(tls, {"tls.crt": first.cert_pem, "tls.key": first.key_pem}, "1")
    config = b"tls_server_config:\n  cert_file: ../tls/tls.crt\n  key_file: ../tls/tls.key\n"
    _secret_volume(web, {"web-config.yaml": config}, "1")
    state = webconfig.WebState(webconfig.load(str(web / "web-config.yaml")))
    assert state.config.tls is not None
    assert state.config.tls.cert_file == str(tls / "tls.crt")
    assert not await state.reload()
    second = ca.issue("b", server=True)
    _secret_volume(tls, {"tls.crt": second.cert_pem, "tls.key": second.key_pem}, "2")
    assert await state.reload()


async def test_a_file_the_failed_config_names_is_watched(tmp_path):
    """A config that names a certificate not written yet loads once the certificate appears."""
    issued = CA("x").issue("a", server=True)
    issued.write(tmp_path, "a.crt", "a.key")
    path = tmp_path / "web.yaml"
    path.write_text("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n")
    state = webconfig.WebState(webconfig.load(str(path)))
    path.write_text("tls_server_config:\n  cert_file: b.crt\n  key_file: b.key\n")
    assert not await state.reload()
    assert not await state.reload()  # nothing changed since the failure: no retry, no new log
    issued.write(tmp_path, "b.crt", "b.key")
    assert await state.reload()
    assert state.config.tls is not None and state.config.tls.cert_file.endswith("b.crt")


def test_cli_refuses_a_bad_file_with_one_line(tmp_path, capsys):
    path = _file(tmp_path, "basic_auth_users:\n  prometheus: hunter2\n")
    assert main(["--check", "--web-config-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a bcrypt hash" in err and str(path) in err
    assert main(["--check", "--web-config-file", str(tmp_path / "absent.yaml")]) == 2
    assert "web config file" in capsys.readouterr().err


def test_cli_reads_the_environment(tmp_path):
    from exporter.cli import build_parser
    from exporter.config.resolve import config_from

    path = _file(tmp_path, "")
    args = build_parser().parse_args([])
    env = {"DCGM_EXPORTER_WEB_CONFIG_FILE": str(path)}
    assert config_from(args, env).web_config_file == str(path)
    assert config_from(args, {}).web_config_file is None


async def test_a_vanished_file_is_reported_once_and_picked_up_again(tmp_path, caplog):
    path = tmp_path / "web.yaml"
    path.write_text(f"basic_auth_users:\n  a: {HASH}\n")
    state = webconfig.WebState(webconfig.load(str(path)))
    path.unlink()
    for _ in range(3):
        assert not await state.reload()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "cannot read it" in errors[0].getMessage()
    assert state.config.users  # the last good one
    path.write_text(f"basic_auth_users:\n  b: {HASH}\n")
    assert await state.reload()
    assert list(state.config.users) == ["b"]


async def test_a_reload_that_would_weaken_the_server_is_refused_and_recorded(tmp_path, caplog):
    """Empty, truncated before the users, or without users: refused while basic auth is on;
    each outcome recorded for the self-metrics, the file's content never logged."""
    path = tmp_path / "web.yaml"
    path.write_text(f"basic_auth_users:\n  a: {HASH}\n")
    state = webconfig.WebState(webconfig.load(str(path)))
    assert state.status.get("web_config").ok
    for weaker in ("", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"):
        path.write_text(weaker)
        assert not await state.reload()
        assert state.config.users and not state.status.get("web_config").ok
    assert HASH not in caplog.text
    assert "restart" in caplog.text
    path.write_text(f"basic_auth_users:\n  a: {HASH}\n  b: {HASH}\n")
    assert await state.reload()
    assert sorted(state.config.users) == ["a", "b"] and state.status.get("web_config").ok
