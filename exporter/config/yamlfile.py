"""dcgm-exporter's ``--config-file`` (YAML, versions 1 and 2): settings and collections.

One document, read once at start through the bounded reader. Strict: an unknown key,
a key given twice, a value of the wrong type, or keys of version 1 in a version 2 file
are errors naming the file and the key. The settings become flag values, consulted
after the flag and its environment variable and before the default; the collections
say which fields are read at their own interval.

Version 1: ``metrics.file`` or ``metrics.fields[]`` ({name, prometheusType, help}),
``metrics.enableExporterMetrics``, ``server.maxConcurrentScrapes``,
``collection.interval``, ``collection.retention.{maxAge,maxSamples}`` and
``collection.watchGroups[]`` ({name, interval, fields[], retention}).
Version 2: ``metrics`` as in version 1, ``server.maxConcurrentScrapes``,
``sources.dcgm.watch.{maxKeepAge,maxKeepSamples}``,
``sources.dcgm.detectBindUnbind.{enabled,pollInterval}`` and ``collections[]``
({name, every, metrics.include[], sources.dcgm.watch}); the collection whose include
is exactly ``["*"]`` is the default one, its ``every`` the collect interval.
Durations are Go durations ("30s", "5m"); a bare number is milliseconds.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.config.durations import parse_duration
from exporter.config.files import ConfigFileError, load_yaml, read_config_file
from exporter.config.model import MIN_INTERVAL_MS, Collection

MAX_BYTES = 256 * 1024
MAX_COLLECTIONS = 64
MAX_PATTERNS = 256  # per collection
MAX_FIELDS = 5000  # metrics.fields rows, as the metrics file's bound
MAX_INTERVAL_S = 86_400.0


class FileError(ValueError):
    """A config file that cannot be used: one line naming the file, the key and the fix."""


@dataclass(frozen=True, slots=True)
class FileConfig:
    """What a config file sets. ``values``: flag long name -> (value as the flag takes
    it, "config file PATH: key"); ``retention``: keys given that only DCGM acts on."""

    path: str
    version: int
    values: dict[str, tuple[str, str]] = field(default_factory=dict)
    metrics_text: str | None = None
    collections: tuple[Collection, ...] = ()
    retention: tuple[str, ...] = ()


def load(path: str) -> FileConfig:
    """Read and validate ``path``; raises FileError (one line) on any problem."""
    try:
        text = read_config_file(path, "config file", MAX_BYTES)
        doc = load_yaml(text, f"config file {path}", unique_keys=True)
    except ConfigFileError as e:
        raise FileError(str(e)) from None
    return parse(doc, path)


def parse(doc: Any, path: str) -> FileConfig:
    """A parsed YAML document -> FileConfig; raises FileError."""
    r = _Reader(path)
    top = r.mapping(
        doc, "", {"version", "metrics", "server", "collection", "sources", "collections"}
    )
    version = top.get("version")
    if type(version) is not int or version not in (1, 2):  # not 2.0, not true
        raise r.error("version", "missing or not 1 or 2; begin the file with version: 1 or 2")
    allowed = {"version", "metrics", "server"}
    allowed |= {"collection"} if version == 1 else {"sources", "collections"}
    r.mapping(doc, "", allowed)  # version 1 and 2 keys are never mixed
    r.metrics(top.get("metrics"))
    server = r.mapping(top.get("server"), "server", {"maxConcurrentScrapes"})
    r.put("max-concurrent-scrapes", server, "server.maxConcurrentScrapes", r.integer)
    if version == 1:
        r.version1(top.get("collection"))
    else:
        r.version2(top.get("sources"), top.get("collections"))
    return FileConfig(
        path, version, r.values, r.metrics_text, tuple(r.collections), tuple(r.retention)
    )


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.values: dict[str, tuple[str, str]] = {}
        self.metrics_text: str | None = None
        self.collections: list[Collection] = []
        self.retention: list[str] = []

    def error(self, key: str, problem: str) -> FileError:
        return FileError(f"config file {self.path}: {key or 'the document'}: {problem}")

    def mapping(self, node: Any, key: str, allowed: set[str]) -> Mapping[str, Any]:
        if node is None and key:
            return {}
        if not isinstance(node, dict):
            raise self.error(key, "expected a mapping of keys")
        for k in node:
            if k not in allowed:
                where = f"{key}.{k}" if key else str(k)
                known = ", ".join(sorted(allowed))
                raise self.error(where[:120], f"unknown key; the keys here are {known}")
        return node

    def sequence(self, node: Any, key: str, limit: int) -> list[Any]:
        if not isinstance(node, list):
            raise self.error(key, "expected a list")
        if len(node) > limit:
            raise self.error(key, f"{len(node)} entries; give at most {limit}")
        return node

    def text(self, node: Any, key: str) -> str:
        if not isinstance(node, str) or not node.strip():
            raise self.error(key, "expected a non-empty string")
        return node.strip()

    def integer(self, node: Any, key: str) -> str:
        if isinstance(node, bool) or not isinstance(node, int):
            raise self.error(key, "expected a whole number")
        return str(node)

    def boolean(self, node: Any, key: str) -> str:
        if not isinstance(node, bool):
            raise self.error(key, "expected true or false")
        return "true" if node else "false"

    def duration(self, node: Any, key: str) -> str:
        """A Go duration as written (the flags take it so), validated."""
        if isinstance(node, bool) or not isinstance(node, str | int):
            raise self.error(key, 'expected a duration such as "30s" or "5m"')
        if isinstance(node, int):
            return f"{node}ms"
        try:
            parse_duration(node)
        except ValueError:
            raise self.error(key, f'{node[:40]!r} is not a duration; write e.g. "30s"') from None
        return node

    def seconds(self, node: Any, key: str) -> float:
        s = parse_duration(self.duration(node, key))
        if not MIN_INTERVAL_MS / 1000 <= s <= MAX_INTERVAL_S:
            raise self.error(key, f"give an interval from {MIN_INTERVAL_MS}ms to 24h")
        return s

    def put(
        self, flag: str, node: Mapping[str, Any], key: str, conv: Callable[[Any, str], str]
    ) -> None:
        name = key.rsplit(".", 1)[-1]
        if name in node:
            self.values[flag] = (conv(node[name], key), f"config file {self.path}: {key}")

    def metrics(self, node: Any) -> None:
        m = self.mapping(node, "metrics", {"file", "fields", "enableExporterMetrics"})
        if "file" in m and "fields" in m:
            raise self.error("metrics", "give file or fields, not both")
        self.put("collectors", m, "metrics.file", self.text)
        self.put("enable-exporter-metrics", m, "metrics.enableExporterMetrics", self.boolean)
        if "fields" in m:
            self.metrics_text = self.fields(m["fields"])

    def fields(self, node: Any) -> str:
        """metrics.fields as metrics-file text (one CSV row each)."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        for i, row in enumerate(self.sequence(node, "metrics.fields", MAX_FIELDS)):
            key = f"metrics.fields[{i}]"
            f = self.mapping(row, key, {"name", "prometheusType", "help"})
            name = self.text(f.get("name"), f"{key}.name")
            kind = self.text(f.get("prometheusType"), f"{key}.prometheusType")
            help_text = f.get("help", "")
            if not isinstance(help_text, str):
                raise self.error(f"{key}.help", "expected a string")
            w.writerow((name, kind, help_text.replace("\n", " ")))
        if not out.getvalue():
            raise self.error("metrics.fields", "empty; list at least one field")
        return out.getvalue()

    def retained(self, node: Any, key: str, age: str, samples: str, flags: bool) -> None:
        """DCGM's watch retention: validated; both 0 is an error (as dcgm-exporter)."""
        r = self.mapping(node, key, {age, samples})
        if not r:
            return
        got = {}
        if age in r:
            seconds = parse_duration(self.duration(r[age], f"{key}.{age}"))
            if seconds < 0:
                raise self.error(f"{key}.{age}", "negative; give 0 or more")
            got["age"] = seconds
        if samples in r:
            n = int(self.integer(r[samples], f"{key}.{samples}"))
            if not 0 <= n <= 2147483647:
                raise self.error(f"{key}.{samples}", "give a number from 0 to 2147483647")
            got["samples"] = n
        if got.get("age") == 0 and got.get("samples") == 0:
            raise self.error(key, f"{age} and {samples} are both 0; DCGM would keep nothing")
        self.retention += [f"{key}.{k}" for k in (age, samples) if k in r]
        if flags:
            self.put("watch-max-keep-age", r, f"{key}.{age}", self.duration)
            self.put("watch-max-keep-samples", r, f"{key}.{samples}", self.integer)

    def version1(self, node: Any) -> None:
        c = self.mapping(node, "collection", {"interval", "retention", "watchGroups"})
        if "interval" in c:
            ms = round(self.seconds(c["interval"], "collection.interval") * 1000)
            self.values["collect-interval"] = (
                str(ms),
                f"config file {self.path}: collection.interval",
            )
        self.retained(c.get("retention"), "collection.retention", "maxAge", "maxSamples", True)
        groups = c.get("watchGroups")
        for i, g in enumerate(self.sequence(groups, "collection.watchGroups", MAX_COLLECTIONS)
                              if groups is not None else ()):  # fmt: skip
            key = f"collection.watchGroups[{i}]"
            m = self.mapping(g, key, {"name", "interval", "fields", "retention"})
            self.retained(m.get("retention"), f"{key}.retention", "maxAge", "maxSamples", False)
            self.collect(
                key, m.get("name"), m.get("interval"), m.get("fields"), "interval", "fields"
            )

    def version2(self, sources: Any, collections: Any) -> None:
        s = self.mapping(sources, "sources", {"dcgm"})
        d = self.mapping(s.get("dcgm"), "sources.dcgm", {"watch", "detectBindUnbind"})
        w = "sources.dcgm.watch"
        self.retained(d.get("watch"), w, "maxKeepAge", "maxKeepSamples", True)
        b = self.mapping(d.get("detectBindUnbind"), "sources.dcgm.detectBindUnbind",
                         {"enabled", "pollInterval"})  # fmt: skip
        self.put("enable-gpu-bind-unbind-watch", b, "sources.dcgm.detectBindUnbind.enabled",
                 self.boolean)  # fmt: skip
        self.put("gpu-bind-unbind-poll-interval", b,
                 "sources.dcgm.detectBindUnbind.pollInterval", self.duration)  # fmt: skip
        items = collections if collections is not None else []
        for i, c in enumerate(self.sequence(items, "collections", MAX_COLLECTIONS)):
            key = f"collections[{i}]"
            m = self.mapping(c, key, {"name", "every", "metrics", "sources"})
            inc = self.mapping(m.get("metrics"), f"{key}.metrics", {"include"}).get("include")
            src = self.mapping(m.get("sources"), f"{key}.sources", {"dcgm"})
            dcgm = self.mapping(src.get("dcgm"), f"{key}.sources.dcgm", {"watch"})
            self.retained(dcgm.get("watch"), f"{key}.sources.dcgm.watch", "maxKeepAge",
                          "maxKeepSamples", False)  # fmt: skip
            if inc == ["*"]:  # the default collection: its every is the collect interval
                if "collect-interval" in self.values:
                    raise self.error(key, 'a second collection including ["*"]; keep one')
                ms = round(self.seconds(m.get("every"), f"{key}.every") * 1000)
                self.values["collect-interval"] = (str(ms), f"config file {self.path}: {key}.every")
                self.text(m.get("name"), f"{key}.name")
                continue
            self.collect(key, m.get("name"), m.get("every"), inc, "every", "metrics.include")

    def collect(self, key: str, name: Any, every: Any, patterns: Any, ek: str, pk: str) -> None:
        """One collection read at its own interval."""
        label = self.text(name, f"{key}.name")
        if any(c.name == label for c in self.collections):
            raise self.error(f"{key}.name", f"{label[:60]!r} is used twice; name each once")
        interval = self.seconds(every, f"{key}.{ek}")
        if patterns is None:
            raise self.error(f"{key}.{pk}", "missing; list the fields (glob patterns) to read")
        pats = tuple(
            self.text(p, f"{key}.{pk}[{j}]")
            for j, p in enumerate(self.sequence(patterns, f"{key}.{pk}", MAX_PATTERNS))
        )
        if not pats:
            raise self.error(f"{key}.{pk}", "empty; list the fields (glob patterns) to read")
        where = f"config file {self.path}: {key}"
        self.collections.append(Collection(label, interval, pats, where))
