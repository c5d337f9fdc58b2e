"""The web config on any input: a config or one WebConfigError, nothing else; and the
Authorization header parser on any header."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.config.files import ConfigFileError, load_yaml
from exporter.http import webconfig
from tests.fuzz.strategies import FAST, TEXT, yaml_like

KEYS = sorted(
    webconfig.TOP_KEYS
    | webconfig.TLS_KEYS
    | webconfig.HTTP_KEYS
    | set(webconfig.HEADERS)
    | {"prometheus", "tls.crt", "tls.key", "ca.crt", "TLS12", "TLS13", "NoClientCert"}
    | {"RequireAndVerifyClientCert", "deny", "nosniff", "$2y$04$" + "a" * 53}
)
SHAPED = st.fixed_dictionaries(
    {},
    optional={
        "tls_server_config": yaml_like(KEYS),
        "http_server_config": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"headers": yaml_like(KEYS), "http2": yaml_like(KEYS)}
            ),
            yaml_like(KEYS),
        ),
        "basic_auth_users": st.one_of(
            st.dictionaries(TEXT, yaml_like(KEYS), max_size=3), yaml_like(KEYS)
        ),
    },
)


@FAST
@given(st.one_of(SHAPED, yaml_like(KEYS)))
def test_any_parsed_yaml_gives_a_config_or_value_error(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("web")
    try:
        cfg = webconfig.parse(data, str(folder / "web.yaml"))
    except ValueError as e:
        assert str(e)
        return
    assert all(name in webconfig.HEADERS for name in cfg.headers)
    assert all(h.startswith(b"$2") for h in cfg.users.values())


@FAST
@given(st.one_of(TEXT, st.binary(max_size=300)))
def test_any_file_loads_or_raises_web_config_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("web") / "web.yaml"
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    path.write_bytes(content)
    try:
        webconfig.load(str(path))
    except webconfig.WebConfigError as e:
        assert str(e).startswith(f"web config {path}: ")
        assert e.fingerprint  # what it read, so a retry waits for a change


@FAST
@given(
    st.one_of(
        st.none(),
        TEXT,
        TEXT.map(lambda t: "Basic " + t),
        st.binary().map(lambda b: "Basic " + base64.b64encode(b).decode()),
    )
)
def test_any_authorization_header_parses_or_is_refused(header):
    user, password = webconfig.basic_credentials(header)
    assert user is None or isinstance(user, str)
    assert isinstance(password, bytes)


@FAST
@given(st.text(min_size=1).filter(lambda u: ":" not in u), st.binary())
def test_credentials_come_back_as_sent(user, password):
    header = (
        "Basic "
        + base64.b64encode(user.encode("utf-8", "surrogatepass") + b":" + password).decode()
    )
    try:
        user.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates are not sendable
    assert webconfig.basic_credentials(header) == (user, password)


NAME = st.text("abcdefgh", min_size=1, max_size=6)


@FAST
@given(NAME, st.integers(1, 8), st.integers(1, 8))
def test_anchors_and_aliases_are_refused(name, width, depth):
    """A "billion laughs" file of any shape is refused in one line, never expanded."""
    lines = [f"a0: &{name}0 [x, y]"]
    for level in range(1, depth + 1):
        refs = ", ".join([f"*{name}{level - 1}"] * width)
        lines.append(f"a{level}: &{name}{level} [{refs}]")
    with pytest.raises(ConfigFileError, match="anchors and aliases") as e:
        load_yaml("\n".join(lines), "web config w.yaml")
    assert "\n" not in str(e.value) and f"&{name}0" not in str(e.value)


@FAST
@given(TEXT)
def test_any_yaml_text_loads_or_raises_one_line(text):
    try:
        load_yaml(text, "fleet f.yaml")
    except ConfigFileError as e:
        assert str(e).startswith("fleet f.yaml: not valid YAML: ") and "\n" not in str(e)
