"""Bounded config file reading (exporter/config/files.py) and the reload status it feeds."""

from __future__ import annotations

import os
import time

import pytest

from exporter.config.files import ConfigFileError, load_yaml, read_config_file
from exporter.runtime.signals import ReloadStatus


def test_regular_file_is_read(tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text("a: 1\n")
    assert read_config_file(str(path), "web config") == "a: 1\n"


def test_fifo_is_refused_at_once(tmp_path):
    """Opening a FIFO without a writer would block a plain open(): refused instead."""
    fifo = tmp_path / "metrics.csv"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(
        ConfigFileError, match=r"metrics file .*metrics.csv: not a regular file \(a FIFO\)"
    ):
        read_config_file(str(fifo), "metrics file")
    assert time.monotonic() - t0 < 5  # did not wait for a writer (generous: shared machine)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/", "a directory")]
)
def test_devices_and_directories_are_refused(path, kind):
    with pytest.raises(ConfigFileError, match=kind):
        read_config_file(path, "web config")


def test_size_is_bounded(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * 2049)
    with pytest.raises(ConfigFileError, match="larger than 2 KiB"):
        read_config_file(str(path), "web config", max_bytes=2048)
    path.write_bytes(b"#" * 2048)
    assert len(read_config_file(str(path), "web config", max_bytes=2048)) == 2048


def test_missing_and_non_utf8(tmp_path):
    with pytest.raises(ConfigFileError, match="cannot read it: No such file"):
        read_config_file(str(tmp_path / "nope"), "fleet")
    bad = tmp_path / "latin1"
    bad.write_bytes(b"\xe9\n")
    with pytest.raises(ConfigFileError, match="not UTF-8"):
        read_config_file(str(bad), "fleet")


def test_yaml_without_anchors_loads_and_errors_do_not_quote_the_file():
    assert load_yaml("a: [1, 2]\nb: {c: d}\n", "w") == {"a": [1, 2], "b": {"c": "d"}}
    with pytest.raises(ConfigFileError) as e:
        load_yaml("users:\n  prom: $2b$10$secret\n  - broken", "web config w.yaml")
    assert "secret" not in str(e.value) and "line 3" in str(e.value)
    with pytest.raises(ConfigFileError, match="anchors and aliases"):
        load_yaml("a: &x 1\n", "w")


def test_reload_status_keeps_the_last_success():
    status = ReloadStatus()
    status.record("web_config", True, when=100.0)
    status.record("web_config", False, when=200.0)
    status.record("metrics_file", False, when=150.0)
    assert dict(status.items()) == {
        "metrics_file": status.get("metrics_file"),
        "web_config": status.get("web_config"),
    }
    web = status.get("web_config")
    assert web is not None and (web.ok, web.last_success_unix) == (False, 100.0)
    metrics = status.get("metrics_file")
    assert metrics is not None and (metrics.ok, metrics.last_success_unix) == (False, 0.0)
