"""Basic auth and response headers: the real exporter over HTTP, and the check itself in-process."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from exporter.http import webconfig
from exporter.http.webconfig import auth
from tests.support.client import get, start

PASSWORD = "correct horse battery staple"


def _config(tmp: Path, cost: int = 10) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(cost)).decode()
    path = tmp / "web-config.yaml"
    path.write_text(
        f"basic_auth_users:\n  prometheus: {hashed}\n"
        "http_server_config:\n  headers:\n"
        "    X-Content-Type-Options: nosniff\n    X-Frame-Options: deny\n"
    )
    return path


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    exp = start(_config(tmp_path_factory.mktemp("auth")), None)
    yield exp
    exp.stop()


@pytest.mark.parametrize(
    ("user", "status"),
    [
        (("prometheus", PASSWORD), 200),
        (("prometheus", PASSWORD + "!"), 401),
        (("prometheus", ""), 401),
        (("grafana", PASSWORD), 401),
        (None, 401),
    ],
    ids=["right", "wrong", "empty", "unknown-user", "missing"],
)
@pytest.mark.parametrize("path", ["/metrics", "/"])
def test_password(exporter, path, user, status):
    got, headers, body, _ = get(exporter.port, path, user=user)
    assert got == status
    if status == 401:
        assert headers["WWW-Authenticate"].startswith("Basic ")
        assert b"DCGM" not in body
    elif path == "/metrics":
        assert b"DCGM_FI_DEV_GPU_TEMP{" in body


def test_malformed_authorization_is_401(exporter):
    import http.client

    for value in ("Basic !!!", "Basic " + "cHJvbWV0aGV1cw==", "Bearer abc", "Basic"):
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
        conn.request("GET", "/metrics", headers={"Authorization": value})
        assert conn.getresponse().status == 401, value
        conn.close()


def test_probes_need_no_password(exporter):
    for path in sorted(webconfig.PROBES):
        status, headers, _, _ = get(exporter.port, path)
        assert status == 200, path
        assert headers["X-Content-Type-Options"] == "nosniff"
    # only the probe routes themselves: not a look-alike, not a query string
    assert get(exporter.port, "/health/")[0] == 401
    assert get(exporter.port, "/metrics?/health")[0] == 401


def test_headers_on_every_response(exporter):
    for path, user in (("/metrics", ("prometheus", PASSWORD)), ("/metrics", None), ("/nope", None)):
        _, headers, _, _ = get(exporter.port, path, user=user)
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "deny"


def test_probe_paths_are_served_routes():
    from aiohttp import web

    from exporter.http.routes import routes

    app = web.Application()
    routes(app)
    served = {r.canonical for r in app.router.resources()}
    assert served >= webconfig.PROBES


# In-process: what the check does, without a server.


@pytest.fixture
def state(tmp_path):
    return webconfig.WebState(webconfig.load(str(_config(tmp_path, cost=8))))


def _header(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_every_failure_costs_one_bcrypt_check_of_the_same_cost(state, monkeypatch):
    """Unknown users are checked against a decoy hash of the users' cost: a wrong user and
    a wrong password take the same path and the same time, and bcrypt's comparison is
    constant-time."""
    seen = []
    real = bcrypt.checkpw

    def spy(password, hashed):
        seen.append(hashed[:7])
        return real(password, hashed)

    monkeypatch.setattr(auth.bcrypt, "checkpw", spy)
    assert not await state.authorized(_header("grafana", PASSWORD))
    assert not await state.authorized(_header("prometheus", "nope"))
    assert seen == [b"$2b$08$", b"$2b$08$"]
    assert auth.decoy(8) != state.config.users["prometheus"]


async def test_unknown_user_and_wrong_password_take_the_same_time(state):
    async def median(user: str, password: str) -> float:
        times = []
        for i in range(7):  # a new password each time: outcomes are cached
            t = time.perf_counter()
            assert not await state.authorized(_header(user, f"{password}{i}"))
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    unknown = await median("grafana", PASSWORD)
    wrong = await median("prometheus", "nope")
    assert 0.5 < unknown / wrong < 2.0, (unknown, wrong)


async def test_outcomes_are_cached_across_reloads_until_the_hash_changes(state, monkeypatch):
    """As exporter-toolkit: a verified password is not checked again, also after a reload
    of an unchanged user; a new hash for the user is checked afresh."""
    assert await state.authorized(_header("prometheus", PASSWORD))
    calls = []
    monkeypatch.setattr(auth.bcrypt, "checkpw", lambda *a: calls.append(a) or False)
    assert await state.authorized(_header("prometheus", PASSWORD))  # from the cache
    assert not await state.authorized(_header("prometheus", PASSWORD + "x"))
    assert not await state.authorized(_header("prometheus", PASSWORD + "x"))  # cached refusal
    assert len(calls) == 1
    assert await state.reload(force=True)
    assert await state.authorized(_header("prometheus", PASSWORD))  # same hash: still cached
    assert len(calls) == 1
    path = Path(state.config.path)
    path.write_text(path.read_text().replace("$2b$08$", "$2b$09$"))  # another hash
    assert await state.reload(force=True)
    assert not await state.authorized(_header("prometheus", PASSWORD))  # checked afresh
    assert len(calls) == 2


async def test_a_flood_of_logins_gets_503_not_a_queue(state, monkeypatch):
    """Past the bounded queue, a login is refused at once (503) instead of waiting behind
    a flood of wrong passwords; the cached real scraper is never queued."""
    assert await state.authorized(_header("prometheus", PASSWORD))
    release = threading.Event()

    def slow(*_args):
        release.wait(5)
        return False

    monkeypatch.setattr(auth.bcrypt, "checkpw", slow)
    flood = [
        asyncio.ensure_future(state.authorized(_header("prometheus", f"guess{i}")))
        for i in range(auth.WORKERS + auth.QUEUE)
    ]
    await asyncio.sleep(0.05)
    assert await state.authorized(_header("prometheus", "one more")) is None  # busy: 503
    assert await state.authorized(_header("prometheus", PASSWORD))  # cached: no queue
    release.set()
    assert not any(await asyncio.gather(*flood))


async def test_password_longer_than_bcrypt_reads_is_refused(tmp_path):
    """bcrypt reads 72 bytes; a longer password is refused, never cut to match."""
    path = tmp_path / "web-config.yaml"
    path.write_text(
        f"basic_auth_users:\n  long: {bcrypt.hashpw(b'a' * 72, bcrypt.gensalt(4)).decode()}\n"
    )
    state = webconfig.WebState(webconfig.load(str(path)))
    assert await state.authorized(_header("long", "a" * 72))
    assert not await state.authorized(_header("long", "a" * 72 + "b"))
