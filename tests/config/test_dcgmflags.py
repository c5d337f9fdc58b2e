"""dcgm-exporter's flags of 4.8.3, 4.8.4 and after, and its --config-file: each flag with
its variable, defaults, precedence (flag > variable > config file > default) and the
startup errors and warnings dcgm-exporter defines (shared/REFERENCE section 9)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter import sim
from exporter.cli import build_parser
from exporter.config import validate
from exporter.config.dcgmflags import DCGM_FLAGS
from exporter.config.durations import parse_duration
from exporter.config.model import ConfigError, DeviceSelection, default_metrics_file, parse_devices
from exporter.config.resolve import config_from
from tests.exposition.test_families import make_node
from tests.procs import free_port
from tests.support.exposition import find

CONFIGS = Path(__file__).parent.parent / "fixtures" / "config"


def cfg(argv, env=None):
    return config_from(build_parser().parse_args(argv), env or {})


def error(argv, env=None) -> str:
    with pytest.raises(ConfigError) as e:
        cfg(argv, env)
    return str(e.value)


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return str(p)


def test_47_flags_of_4_8_4_and_health_require_gpus():
    since = [f.since for f in DCGM_FLAGS]
    assert len(DCGM_FLAGS) == 48 and since.count("4.8.3") == 5 and since.count("4.8.4") == 4
    assert [f.long for f in DCGM_FLAGS if f.since == "PR 744"] == ["health-require-gpus"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300ms", 0.3), ("-1.5h", -5400.0), ("2h45m", 9900.0), ("10s", 10.0), ("0", 0.0),
     ("1m30.5s", 90.5), (".5s", 0.5), ("1us", 1e-6), ("1µs", 1e-6)],
)  # fmt: skip
def test_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "s", "10 s", "1x", "--1s", "1s ", "1e3s"])
def test_not_go_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


# --- --config-file -----------------------------------------------------------------


def test_config_file_version_2_nvidia_example():
    c = cfg(["--config-file", str(CONFIGS / "v2.yaml")])
    assert c.interval_s == 30.0 and c.max_concurrent_scrapes == 8
    assert [(g.name, g.interval_s, g.patterns) for g in c.collections] == [
        ("fast-thermals", 5.0, ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE")),
        ("slow-nvlink", 300.0, ("DCGM_FI_DEV_NVLINK_*",)),
    ]
    # the watch retention keys are DCGM's: accepted, named at startup
    assert "--watch-max-keep-age" in c.no_effect
    assert any("maxKeepAge" in n and "no effect" in n for n in c.notices)


def test_config_file_version_1():
    env = {"DCGM_EXPORTER_CONFIG_FILE": str(CONFIGS / "v1.yaml")}
    c = cfg([], env)
    assert c.config_file.endswith("v1.yaml") and c.interval_s == 30.0
    assert [(g.name, g.interval_s) for g in c.collections] == [("fast-thermals", 5.0)]
    assert not any("enable-exporter-metrics" in n for n in c.notices)  # true: served


def test_precedence_flag_then_variable_then_file_then_default(tmp_path):
    path = write(tmp_path, "version: 1\ncollection:\n  interval: 2s\n")
    assert cfg(["--config-file", path]).interval_s == 2.0
    env = {"DCGM_EXPORTER_INTERVAL": "3000"}
    assert cfg(["--config-file", path], env).interval_s == 3.0
    assert cfg(["--config-file", path, "-c", "4000"], env).interval_s == 4.0
    assert cfg([]).interval_s == 30.0
    # a bare number is milliseconds, as the flag's unit
    assert cfg(["--config-file", write(tmp_path, "version: 1\ncollection: {interval: 1500}\n")]
               ).interval_s == 1.5  # fmt: skip


@pytest.mark.parametrize(
    ("text", "key", "what"),
    [
        ("version: 3\n", "version", "not 1 or 2"),
        ("metrics: {}\n", "version", "not 1 or 2"),
        ("version: 1\ncolection: {}\n", "colection", "unknown key"),
        ("version: 2\ncollection: {interval: 5s}\n", "collection", "unknown key"),
        ("version: 1\ncollections: []\n", "collections", "unknown key"),
        ("version: 1\ncollection:\n  interval: 5s\n  interval: 6s\n", "", "given twice"),
        ("version: 1\ncollection: {interval: fast}\n", "collection.interval", "not a duration"),
        ("version: 1\ncollection: {interval: 10ms}\n", "collection.interval", "from 100ms"),
        ("version: 1\nserver: {maxConcurrentScrapes: many}\n", "server.maxConcurrentScrapes",
         "whole number"),
        ("version: 1\nmetrics: {file: a.csv, fields: []}\n", "metrics", "not both"),
        ("version: 1\nmetrics: {enableExporterMetrics: yes please}\n",
         "metrics.enableExporterMetrics", "true or false"),
        ("version: 1\ncollection:\n  retention: {maxAge: 0, maxSamples: 0}\n",
         "collection.retention", "both 0"),
        ("version: 2\nsources: {dcgm: {watch: {maxKeepSamples: -1}}}\n",
         "sources.dcgm.watch.maxKeepSamples", "0 to 2147483647"),
        ("version: 1\ncollection:\n  watchGroups:\n    - {name: a, interval: 1s}\n",
         "collection.watchGroups[0].fields", "missing"),
        ("version: 1\ncollection:\n  watchGroups:\n    - {name: a, interval: 1s, fields: [X]}\n"
         "    - {name: a, interval: 2s, fields: [Y]}\n", "collection.watchGroups[1].name",
         "used twice"),
        ("version: 2\ncollections:\n  - {name: a, every: 1s, metrics: {include: ['*']}}\n"
         "  - {name: b, every: 2s, metrics: {include: ['*']}}\n", "collections[1]", "second"),
        ("version: 1\n- a\n", "", "not valid YAML"),
        ("version: 1\nx: &a 1\ny: *a\n", "", "anchors"),
    ],
)  # fmt: skip
def test_config_file_errors_name_file_and_key(tmp_path, text, key, what):
    path = write(tmp_path, text)
    msg = error(["--config-file", path])
    assert msg.startswith(f"--config-file: config file {path}") and what in msg, msg
    assert f": {key}:" in msg or not key, msg
    assert "\n" not in msg


def test_config_file_must_be_a_regular_bounded_file(tmp_path):
    assert "cannot read it" in error(["--config-file", str(tmp_path / "none.yaml")])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in error(["--config-file", str(fifo)])
    big = tmp_path / "big.yaml"
    big.write_text("version: 1\n" + "#" * (300 * 1024))
    assert "larger than" in error(["--config-file", str(big)])


def test_collection_patterns_checked_against_the_metrics_file(tmp_path):
    path = write(tmp_path, "version: 2\ncollections:\n"
                 "  - {name: a, every: 1s, metrics: {include: [DCGM_FI_DEV_GPU_TEMP]}}\n"
                 "  - {name: b, every: 2s, metrics: {include: ['DCGM_FI_DEV_*_TEMP']}}\n"
                 )  # fmt: skip
    _, problems = validate.validate(cfg(["--config-file", path, "-a", f"127.0.0.1:{free_port()}"]))
    assert len(problems) == 1 and "DCGM_FI_DEV_GPU_TEMP is also in collection 'a'" in problems[0]
    path = write(tmp_path, "version: 1\ncollection:\n"
                 "  watchGroups: [{name: a, interval: 1s, fields: [NO_SUCH_*]}]\n")  # fmt: skip
    _, problems = validate.validate(cfg(["--config-file", path, "-a", f"127.0.0.1:{free_port()}"]))
    assert "'NO_SUCH_*' matches no row" in problems[0] and "watchGroups[0]" in problems[0]


def test_metrics_fields_of_the_config_file(tmp_path):
    path = write(tmp_path, "version: 2\nmetrics:\n  fields:\n"
                 "    - {name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: 'Temp, in C.'}\n"
                 "    - {name: DCGM_FI_DRIVER_VERSION, prometheusType: label}\n")  # fmt: skip
    c = cfg(["--config-file", path, "-a", f"127.0.0.1:{free_port()}"])
    catalog, problems = validate.validate(c)
    assert problems == [] and catalog is not None
    assert [(m.name, m.help) for m in catalog.metrics] == [("DCGM_FI_DEV_GPU_TEMP", "Temp, in C.")]
    assert [m.name for m in catalog.labels] == ["DCGM_FI_DRIVER_VERSION"]
    # -f still wins over the config file
    assert cfg(["--config-file", path, "-f", default_metrics_file()]).metrics_text is None


# --- the flags of 4.8.3 --------------------------------------------------------------


def test_web_timeouts_set_the_http_timeouts():
    c = cfg(["--web-read-timeout", "20s"], {"DCGM_EXPORTER_WEB_WRITE_TIMEOUT": "1m"})
    assert (c.http_timeout_s, c.http_write_timeout_s, c.notices) == (20.0, 60.0, ())
    # this exporter's own flag wins over dcgm-exporter's
    c = cfg(["--web-read-timeout", "20s", "--http-timeout", "5000"])
    assert c.http_timeout_s == 5.0


@pytest.mark.parametrize("value", ["abc", "30", "0s", "2h"])
def test_unparsable_web_timeout_warns_and_keeps_the_default(value):
    c = cfg(["--web-write-timeout", value])
    assert c.http_write_timeout_s == 15.0
    assert len(c.notices) == 1 and "--web-write-timeout" in c.notices[0]


def test_container_labels_rules():
    msg = error(["--container-labels"])
    assert "needs --container-runtime-socket" in msg
    c = cfg(["--container-labels", "--container-runtime-socket", "/run/docker.sock"])
    assert c.container_socket == "/run/docker.sock"
    env = {"DCGM_EXPORTER_CONTAINER_LABELS": "true", "DCGM_CONTAINER_RUNTIME_SOCKET": "/x.sock"}
    assert cfg([], env).container_socket == "/x.sock"
    c = cfg(["--container-labels", "-k"])  # with -k: ignored, with a warning
    assert c.container_socket is None and any("ignored with -k" in n for n in c.notices)
    assert cfg(["--container-runtime-socket", "/x.sock"]).container_socket is None
    assert "not a boolean" in error([], {"DCGM_EXPORTER_CONTAINER_LABELS": "yes"})


# --- the flags of 4.8.4 --------------------------------------------------------------


def test_max_concurrent_scrapes():
    assert cfg([]).max_concurrent_scrapes == 16
    assert cfg(["--max-concurrent-scrapes", "4"]).max_concurrent_scrapes == 4
    assert cfg([], {"DCGM_EXPORTER_MAX_CONCURRENT_SCRAPES": "2"}).max_concurrent_scrapes == 2
    for bad in ("0", "-1"):
        assert "give a positive number" in error(["--max-concurrent-scrapes", bad])
    assert "not a number of scrapes" in error(["--max-concurrent-scrapes", "lots"])


def test_enable_exporter_metrics():
    assert cfg(["--enable-exporter-metrics"]).notices == ()
    c = cfg([], {"DCGM_EXPORTER_ENABLE_EXPORTER_METRICS": "false"})
    assert len(c.notices) == 1 and "always served" in c.notices[0]
    assert "not a boolean" in error([], {"DCGM_EXPORTER_ENABLE_EXPORTER_METRICS": "maybe"})


def test_watch_retention_validated_and_without_effect():
    c = cfg(["--watch-max-keep-age", "5m", "--watch-max-keep-samples", "100"])
    assert c.no_effect == ("--watch-max-keep-age", "--watch-max-keep-samples")
    assert "both 0" in error(["--watch-max-keep-age", "0", "--watch-max-keep-samples", "0"])
    assert "not a duration" in error(["--watch-max-keep-age", "ten minutes"])
    assert "not a duration" in error(["--watch-max-keep-age=-1m"])
    assert "2147483647" in error([], {"DCGM_EXPORTER_WATCH_MAX_KEEP_SAMPLES": "2147483648"})


def test_health_require_gpus():
    assert cfg([]).health_require_gpus is False
    assert cfg(["--health-require-gpus"]).health_require_gpus is True
    assert cfg([], {"DCGM_EXPORTER_HEALTH_REQUIRE_GPUS": "1"}).health_require_gpus is True


# --- changed: -d, --dcgm-log-level, --enable-pprof, --hpc-job-mapping-dir, systemd -----


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("g+i", DeviceSelection("g+i")),
        ("i:1+g:0", DeviceSelection("g+i", frozenset({0}), frozenset({1}))),
        ("g:0,2-3+i:1-2", DeviceSelection("g+i", frozenset({0, 2, 3}), frozenset({1, 2}))),
    ],
)
def test_devices_gpus_and_instances_together(value, want):
    assert parse_devices(value, "-d") == want


def test_devices_gpus_and_instances_series(tmp_path):
    """g:IDS+i:IDS: the series of -d g:IDS and those of -d i:IDS (the simulated node has
    MIG GPUs 6 and 7, each with a GPU instance 7)."""
    c = cfg(["-d", "g:0,6+i:7"])
    _driver, col, cycle = make_node(tmp_path, cfg=c)
    try:
        power = find(cycle(), "DCGM_FI_DEV_POWER_USAGE")
    finally:
        col.close()
        sim.uninstall()
    got = sorted((s.labels["gpu"], s.labels.get("GPU_I_ID", "")) for s in power)
    assert got == [("0", ""), ("6", ""), ("6", "7"), ("7", "7")]


@pytest.mark.parametrize(
    ("value", "what"),
    [("f+g", "not a device selection"), ("g+g", "names g twice"), ("g:1+i+i", "names i twice"),
     ("g:3-1", "a <= b"), ("g+", "not a device selection"), ("g+x:1", "not a device selection")],
)  # fmt: skip
def test_devices_errors(value, what):
    assert what in error(["-d", value])


def test_dcgm_log_level_must_be_one_of_dcgms():
    assert cfg(["--dcgm-log-level", "WARN"]).no_effect == ("--dcgm-log-level",)
    msg = error([], {"DCGM_EXPORTER_DCGM_LOG_LEVEL": "VERBOSE"})
    assert "not a DCGM log level" in msg and "NONE, FATAL, ERROR, WARN, INFO, DEBUG" in msg


def test_pprof_needs_a_web_config_file(tmp_path):
    assert "--enable-pprof needs --web-config-file" in error(["--enable-pprof"])
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    c = cfg(["--enable-pprof", "--web-config-file", str(web)])
    assert "--enable-pprof" in c.no_effect


def test_hpc_job_mapping_dir_is_implemented():
    c = cfg(["--hpc-job-mapping-dir", "/run/slurm/gpu-jobs"])
    assert c.hpc_job_dir == "/run/slurm/gpu-jobs" and c.no_effect == ()
    assert cfg([], {"DCGM_HPC_JOB_MAPPING_DIR": "/x"}).hpc_job_dir == "/x"


def test_web_systemd_socket_needs_the_sockets_systemd_passes():
    msg = error(["--web-systemd-socket"])
    assert "LISTEN_PID does not name this process" in msg
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2"}
    assert cfg(["--web-systemd-socket"], env).systemd_fds == (3, 4)
    env["LISTEN_FDS"] = "0"
    assert "LISTEN_FDS names no socket" in error([], {**env, "DCGM_EXPORTER_SYSTEMD_SOCKET": "t"})
    assert cfg([], env).systemd_fds == ()  # without the flag, systemd's variables are ignored


# --- integers from files and the environment: ASCII digits, bounded ---------------------


@pytest.mark.parametrize(
    "pid", ["\u0661\u0662", "1" * 5000, "+{pid}", "{pid}_", "{pid}.0", "0x1f", "-{pid}"]
)
def test_listen_pid_is_ascii_digits_of_this_process(pid):
    """Unicode digits, 5,000 digits, a sign, an underscore: one clear error, no traceback
    (int() takes the first ones and fails past 4,300 digits with a ValueError)."""
    env = {"LISTEN_PID": pid.format(pid=os.getpid()), "LISTEN_FDS": "1"}
    assert "LISTEN_PID does not name this process" in error(["--web-systemd-socket"], env)


@pytest.mark.parametrize("fds", ["\u0661", "\uff11", "1" * 5000, "1_0", "+1", " "])
def test_listen_fds_is_ascii_digits(fds):
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": fds}
    assert "LISTEN_FDS names no socket" in error(["--web-systemd-socket"], env)


@pytest.mark.parametrize(
    "text",
    [
        "version: 2.0\n",  # YAML's float: not the version 2
        "version: 2\nserver:\n  maxConcurrentScrapes: " + "9" * 5000 + "\n",
        "version: " + "1" * 5000 + "\n",
        "version: 1\n" + "1" * 5000 + ": x\n",  # as a key
    ],
)
def test_config_file_numbers_are_bounded(tmp_path, text):
    msg = error(["--config-file", write(tmp_path, text)])
    assert "\n" not in msg and len(msg) < 400
    assert "version" in msg or "digits" in msg or "not valid YAML" in msg


@pytest.mark.parametrize("value", ["\u0661\u0660\u0660\u0660", "1_000", "+1000", "9" * 5000])
def test_flag_numbers_from_the_environment_are_ascii_digits(value):
    msg = error([], {"DCGM_EXPORTER_INTERVAL": value})
    assert "is not a collection interval" in msg and len(msg) < 400


def test_a_5000_digit_config_file_number_stops_with_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).parent.parent.parent
    path = write(tmp_path, "version: 2\nserver:\n  maxConcurrentScrapes: " + "9" * 5000 + "\n")
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "--simulate", "--config-file", path], cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "digits" in p.stderr


def test_durations_are_ascii_digits():
    with pytest.raises(ValueError):
        parse_duration("\u0661s")
