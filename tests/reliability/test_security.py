"""What docs/security.md promises about the code: no shell and no eval, no file path
taken from a request, and no secret in the log. The manifests' least privilege is
tests/deploy/test_manifests.py's (test_nothing_privileged, test_rbac_is_read_only_...)."""

from __future__ import annotations

import ast
import base64
import http.client
import signal
import ssl
from pathlib import Path

import bcrypt

from exporter.catalog.metricsfile import load
from exporter.config.model import Config, default_metrics_file
from tests.procs import ROOT, Exporter, wait_until
from tests.support.certs import CA

PACKAGE = ROOT / "exporter"
# Calls that run code or commands, or unpickle: none in the exporter. The simulator's
# runner (a developer tool that runs a program against the simulated driver) is the one
# place that runs code, by design; the generated protobuf stubs are not read by hand.
# exporter/runtime/heap.py opens the C library already loaded (ctypes.CDLL(None), no path) for
# glibc's mallopt and malloc_trim.
FORBIDDEN = {
    "eval", "exec", "compile", "__import__", "os.system", "os.popen", "os.exec",
    "os.spawn", "subprocess", "pickle", "marshal", "shelve", "yaml.load",
    "yaml.unsafe_load", "yaml.full_load", "runpy", "ctypes.CDLL",
}  # fmt: skip
ALLOWED = {("exporter/sim/run.py", "runpy"), ("exporter/runtime/heap.py", "ctypes")}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _uses(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        name = ""
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            for kw in node.keywords:
                if kw.arg == "shell":
                    found.add("shell=")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] + [f"{node.module}.{m}" for m in mods]
            found.update(m for m in mods if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
            continue
        if any(
            name == f or name.startswith(f + ".") or name.startswith(f + "_") for f in FORBIDDEN
        ):
            found.add(name)
    return found


def test_no_shell_eval_or_unpickling_in_the_exporter():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if "/generated/" in rel:
            continue
        used = {
            u for u in _uses(ast.parse(path.read_text())) if (rel, u.split(".")[0]) not in ALLOWED
        }
        if used:
            offenders[rel] = sorted(used)
    assert not offenders, offenders


def test_the_scan_would_notice():
    assert _uses(ast.parse("import subprocess\nsubprocess.run('x', shell=True)")) >= {
        "subprocess",
        "shell=",
    }
    assert _uses(ast.parse("eval(x)\nimport yaml\nyaml.load(s)")) >= {"eval", "yaml.load"}


def test_no_route_takes_a_path_from_the_request():
    """Four fixed paths, no static files, no path parameters: nothing a request sends can
    name a file. (tests/reliability/test_http.py tries traversals against the process.)"""
    from exporter.app import build

    app = build(Config(), load(default_metrics_file()))
    resources = list(app.router.resources())
    assert sorted(r.canonical for r in resources) == ["/", "/health", "/metrics", "/ready"]
    assert all(type(r).__name__ == "PlainResource" for r in resources)


def test_secrets_never_reach_the_log(tmp_path):
    """Passwords (right, wrong, malformed), password hashes, the TLS key and a web config
    that fails to parse on a line holding a secret: none of it appears in the log, even
    at debug level."""
    password = "SECRET-pw-7f3a9c"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    issued = CA("test").issue("127.0.0.1", server=True)
    issued.write(tmp_path, "tls.crt", "tls.key")
    web = tmp_path / "web.yaml"
    web.write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    node = Exporter(
        "-c", "500", "--log-level", "debug", "--web-config-file", str(web), log=tmp_path / "log"
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

    def get(auth: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", node.port, timeout=5, context=ctx)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": auth})
            return conn.getresponse().status
        finally:
            conn.close()

    try:

        def up() -> bool:
            try:
                return get("") == 401
            except OSError:
                return False

        wait_until(up, 20, "the exporter over TLS")
        basic = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
        wrong = "Basic " + base64.b64encode(b"prometheus:SECRET-wrong-1b2c").decode()
        nouser = "Basic " + base64.b64encode(b"SECRET-user-9d8e:SECRET-pw-x").decode()
        assert get(basic) == 200
        assert get(wrong) == 401 and get(nouser) == 401
        assert get("Bearer SECRET-token-5a5a") == 401
        # a broken edit of the file, on the line with the hash: refused, and said so
        web.write_text(web.read_text().replace(f"prometheus: {hashed}", f"prometheus: [{hashed}"))
        node.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "not valid YAML" in node.output(), 10, "the reload error")
        assert get(basic) == 200  # the last good config stays
    finally:
        log = node.stop()
    key = Path(tmp_path / "tls.key").read_text()
    for secret in ("SECRET-", hashed, hashed[7:29], key.splitlines()[1]):
        assert secret not in log, secret
    assert "PRIVATE KEY" not in log


EVIL = 'x"} 1\nDCGM_FORGED{gpu="0"} 666\n# \\'


def test_label_values_cannot_inject_series():
    """Names that reach labels from outside (node name, pod, namespace, container, pod
    labels) are escaped: the exposition parses to the same series, none forged."""
    from exporter import sim
    from exporter.collector import Collector
    from exporter.frame import Holder, Owner
    from tests.support.exposition import Stages, samples

    catalog = load(default_metrics_file())
    sim.install(None, latency=False)
    col = Collector(catalog, EVIL)
    try:
        snap = col.collect()
    finally:
        col.close()
        sim.uninstall()
    owner = Holder(Owner(EVIL, EVIL, EVIL), EVIL, (("label_team", EVIL),))
    plain, held = Stages(), Stages()
    n_clean = plain.publish(snap, catalog)
    n = held.publish(snap, catalog, {d.key: owner for d in snap.entities})
    clean, text = plain.text, held.text
    parsed = samples(text)
    assert n == n_clean == len(samples(clean)) == len(parsed)
    assert not any(s.name == "DCGM_FORGED" for s in parsed)
    hostnames = {s.labels["Hostname"] for s in parsed}
    assert hostnames == {EVIL.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")}
