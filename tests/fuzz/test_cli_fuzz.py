"""The command line on any flags and environment: a Config, or one usage error (exit 2)
or one ConfigError naming the input; never another exception."""

from __future__ import annotations

import contextlib
import io

from hypothesis import given
from hypothesis import strategies as st

from exporter.cli import build_parser
from exporter.config.dcgmflags import DCGM_FLAGS
from exporter.config.model import ConfigError
from exporter.config.resolve import config_from
from tests.fuzz.strategies import FAST, SPECIAL, TEXT

OPTIONS = sorted(
    {o for a in build_parser()._actions for o in a.option_strings}
    - {"-h", "--help"}
    - {"-v", "--version"}
)
ENV_NAMES = [f.env for f in DCGM_FLAGS] + [
    "GPU_EXPORTER_SIMULATE",
    "GPU_EXPORTER_LOG_LEVEL",
    "GPU_EXPORTER_HOSTNAME_LABEL",
    "GPU_EXPORTER_COLLECT_TIMEOUT",
    "GPU_EXPORTER_KUBERNETES_DRA",
]
VALUE = st.one_of(
    TEXT,
    SPECIAL,
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(
        ["true", "false", "0", "1", "f", "g:0,1", "i:2-4", ":9400", "127.0.0.1:1", "json", "debug"]
    ),
)
ARG = st.one_of(
    st.sampled_from(OPTIONS),
    st.tuples(st.sampled_from(OPTIONS), VALUE).map(lambda t: f"{t[0]}={t[1]}"),
    VALUE,
)
# values with a NUL cannot be put in a real environment; the exporter never sees them
ENV = st.dictionaries(st.sampled_from(ENV_NAMES), VALUE.filter(lambda v: "\x00" not in v))


@FAST
@given(st.lists(ARG, max_size=8), ENV)
def test_any_command_line_gives_a_config_or_one_clear_error(argv, env):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpu-exporter: error: "), lines
        return
    try:
        config_from(args, env)
    except ConfigError as e:
        # names the flag or the variable first
        assert str(e).startswith(("-", "environment variable ")), str(e)
