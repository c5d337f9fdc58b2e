"""dcgm-exporter's command line (4.x, its pkg/cmd/app.go): every flag, short alias and
environment variable, and one rule to resolve them: the flag, else the environment
variable, else the default.

Flags that only DCGM can act on are accepted, so a DaemonSet written for
dcgm-exporter starts unchanged, and are named once at startup as having no effect.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.config.model import DEFAULT_SOCKET, parse_bool


@dataclass(frozen=True, slots=True)
class Flag:
    """One dcgm-exporter flag: ``long`` without dashes, its short alias and variable."""

    long: str
    short: str
    env: str
    default: str
    help: str
    boolean: bool = False
    dcgm_only: bool = False  # accepted; needs DCGM, so it changes nothing here
    since: str = ""  # the dcgm-exporter release that added it (docs/compatibility.md)

    @property
    def dest(self) -> str:
        return self.long.replace("-", "_")

    @property
    def option(self) -> str:
        return f"-{self.short}/--{self.long}" if self.short else f"--{self.long}"


_DCGM = "needs DCGM; accepted, no effect"
# fmt: off
DCGM_FLAGS: tuple[Flag, ...] = (
    Flag("collectors", "f", "DCGM_EXPORTER_COLLECTORS", "the shipped metrics.csv",
         "metrics file in dcgm-exporter's CSV format", since="≤ 2.4.1"),
    Flag("address", "a", "DCGM_EXPORTER_LISTEN", ":9400", "listen address [host]:port",
         since="≤ 2.4.1"),
    Flag("collect-interval", "c", "DCGM_EXPORTER_INTERVAL", "30000",
         "collection interval in milliseconds", since="≤ 2.4.1"),
    Flag("kubernetes", "k", "DCGM_EXPORTER_KUBERNETES", "false",
         "add pod, namespace and container labels from the kubelet", boolean=True, since="≤ 2.4.1"),
    Flag("use-old-namespace", "o", "DCGM_EXPORTER_USE_OLD_NAMESPACE", "false",
         "serve dcgm-exporter 1.x metric names (dcgm_gpu_temp, ...)",
         boolean=True, since="≤ 2.4.1"),
    Flag("cpu-devices", "p", "DCGM_EXPORTER_CPU_DEVICES_STR", "f", f"CPU devices; {_DCGM}",
         dcgm_only=True, since="3.3.0"),
    Flag("configmap-data", "m", "DCGM_EXPORTER_CONFIGMAP_DATA", "none",
         f"metrics from a ConfigMap via the API server; {_DCGM} (use -f)",
         dcgm_only=True, since="2.5.0"),
    Flag("remote-hostengine-info", "r", "DCGM_REMOTE_HOSTENGINE_INFO", "localhost:5555",
         f"remote nv-hostengine; {_DCGM}", dcgm_only=True, since="≤ 2.4.1"),
    Flag("kubernetes-enable-pod-labels", "", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
         "false", "copy pod labels under their own (sanitized) names (needs the API server)",
         boolean=True, since="4.2.0"),
    Flag("kubernetes-enable-pod-uid", "", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "false",
         "add a pod_uid label (needs the API server)", boolean=True, since="4.5.0"),
    Flag("kubernetes-gpu-id-type", "", "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "uid",
         "device ID form the device plugin reports (uid or device-name); both are "
         "recognised either way", since="≤ 2.4.1"),
    Flag("kubernetes-pod-label-allowlist-regex", "",
         "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", "all labels",
         "comma-separated regexes of the pod label names to copy", since="4.6.0"),
    Flag("devices", "d", "DCGM_EXPORTER_DEVICES_STR", "f",
         "devices to watch: f (each GPU, its instances with MIG), g[:IDS], i[:IDS], "
         "or both g[:IDS]+i[:IDS]",
         since="≤ 2.4.1"),
    Flag("no-hostname", "n", "DCGM_EXPORTER_NO_HOSTNAME", "false",
         "leave out the node label (hostname, or Hostname up to 4.8.2: --hostname-label)",
         boolean=True, since="≤ 2.4.1"),
    Flag("switch-devices", "s", "DCGM_EXPORTER_OTHER_DEVICES_STR", "f",
         f"NVSwitch devices; {_DCGM}", dcgm_only=True, since="3.1.2"),
    Flag("fake-gpus", "", "DCGM_EXPORTER_USE_FAKE_GPUS", "false",
         f"DCGM's fake GPUs; {_DCGM} (use --simulate)",
         boolean=True, dcgm_only=True, since="≤ 2.4.1"),
    Flag("web-config-file", "", "DCGM_EXPORTER_WEB_CONFIG_FILE", "none",
         "TLS, basic auth and response headers, in exporter-toolkit's web config format; "
         "re-read when it or a file it names changes", since="3.3.0"),
    Flag("xid-count-window-size", "x", "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "300000",
         "window of DCGM_EXP_XID_ERRORS_COUNT, in milliseconds", since="3.4.0"),
    Flag("replace-blanks-in-model-name", "rbmn", "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
         "false", "replace blanks in the modelName label with '-'", boolean=True, since="3.4.0"),
    Flag("debug", "", "DCGM_EXPORTER_DEBUG", "false", "log at debug level",
         boolean=True, since="3.4.0"),
    Flag("clock-events-count-window-size", "", "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",
         "300000", "window of DCGM_EXP_CLOCK_EVENTS_COUNT, in milliseconds", since="3.4.0"),
    Flag("enable-dcgm-log", "", "DCGM_EXPORTER_ENABLE_DCGM_LOG", "false",
         f"DCGM's own log; {_DCGM}", boolean=True, dcgm_only=True, since="3.4.1"),
    Flag("dcgm-log-level", "", "DCGM_EXPORTER_DCGM_LOG_LEVEL", "NONE",
         f"DCGM's log level; {_DCGM}", dcgm_only=True, since="3.4.1"),
    Flag("log-format", "", "DCGM_EXPORTER_LOG_FORMAT", "text",
         "log format: text, or json (one JSON object per line)", since="4.1.1"),
    Flag("pod-resources-kubelet-socket", "", "DCGM_POD_RESOURCES_KUBELET_SOCKET",
         DEFAULT_SOCKET, "kubelet pod-resources socket", since="3.4.1"),
    Flag("hpc-job-mapping-dir", "", "DCGM_HPC_JOB_MAPPING_DIR", "none",
         "directory of HPC job files, named by GPU index or <gpu>.<gpu instance>, one job "
         "ID a line: each series of that device is copied once per job with hpc_job",
         since="3.4.2"),
    Flag("nvidia-resource-names", "", "NVIDIA_RESOURCE_NAMES", "none",
         "extra resource names holding NVIDIA GPUs, comma-separated, * allowed; "
         "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* are always read",
         since="3.5.0"),
    Flag("kubernetes-virtual-gpus", "", "KUBERNETES_VIRTUAL_GPUS", "false",
         "one series per pod sharing a time-sliced or MPS GPU", boolean=True, since="4.0.3"),
    Flag("dump-enabled", "", "DCGM_EXPORTER_DUMP_ENABLED", "false",
         f"dump DCGM responses to files; {_DCGM}", boolean=True, dcgm_only=True, since="4.2.0"),
    Flag("dump-directory", "", "DCGM_EXPORTER_DUMP_DIRECTORY", "/tmp/dcgm-exporter-debug",
         f"where dumps go; {_DCGM}", dcgm_only=True, since="4.2.0"),
    Flag("dump-retention", "", "DCGM_EXPORTER_DUMP_RETENTION", "24",
         f"hours dumps are kept; {_DCGM}", dcgm_only=True, since="4.2.0"),
    Flag("dump-compression", "", "DCGM_EXPORTER_DUMP_COMPRESSION", "true",
         f"compress dumps; {_DCGM}", boolean=True, dcgm_only=True, since="4.2.0"),
    Flag("kubernetes-enable-dra", "", "KUBERNETES_ENABLE_DRA", "false",
         "attribute DRA claims of gpu.nvidia.com (needs the API server); "
         "same as --kubernetes-dra", boolean=True, since="4.4.0"),
    Flag("disable-startup-validate", "", "DISABLE_STARTUP_VALIDATE", "false",
         f"skip DCGM's startup checks; {_DCGM}", boolean=True, dcgm_only=True, since="4.5.2"),
    Flag("enable-gpu-bind-unbind-watch", "", "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH",
         "false", f"watch GPU bind/unbind; {_DCGM} (GPUs are enumerated every cycle)",
         boolean=True, dcgm_only=True, since="4.8.0"),
    Flag("gpu-bind-unbind-poll-interval", "", "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL",
         "1s", f"poll interval of that watch; {_DCGM}", dcgm_only=True, since="4.8.0"),
    Flag("enable-pprof", "", "DCGM_EXPORTER_ENABLE_PPROF", "false",
         "Go profiling endpoints; not applicable to this exporter, accepted, no effect; "
         "as dcgm-exporter, an error without --web-config-file",
         boolean=True, dcgm_only=True, since="4.8.2"),
    Flag("web-systemd-socket", "", "DCGM_EXPORTER_SYSTEMD_SOCKET", "false",
         "listen on the sockets systemd passes (LISTEN_FDS, LISTEN_PID) instead of --address",
         boolean=True, since="3.3.0"),
    # dcgm-exporter 4.8.3 (exporter/config/dcgmsettings.py resolves these)
    Flag("config-file", "", "DCGM_EXPORTER_CONFIG_FILE", "none",
         "YAML config file (version 1 or 2): settings below the flags and variables, and "
         "collections read at their own interval", since="4.8.3"),
    Flag("web-read-timeout", "", "DCGM_EXPORTER_WEB_READ_TIMEOUT", "10s",
         "Go duration a client may take to send a request; sets --http-timeout",
         since="4.8.3"),
    Flag("web-write-timeout", "", "DCGM_EXPORTER_WEB_WRITE_TIMEOUT", "30s",
         "Go duration a client may stop reading a response; sets --http-write-timeout",
         since="4.8.3"),
    Flag("container-labels", "", "DCGM_EXPORTER_CONTAINER_LABELS", "false",
         "outside Kubernetes: copy each GPU series per container holding the GPU, with "
         "container (needs --container-runtime-socket)", boolean=True, since="4.8.3"),
    Flag("container-runtime-socket", "", "DCGM_CONTAINER_RUNTIME_SOCKET", "none",
         "unix socket of a Docker-compatible API (docker, podman) for --container-labels",
         since="4.8.3"),
    # dcgm-exporter 4.8.4
    Flag("max-concurrent-scrapes", "", "DCGM_EXPORTER_MAX_CONCURRENT_SCRAPES", "16",
         "/metrics requests answered at once; past it 503", since="4.8.4"),
    Flag("enable-exporter-metrics", "", "DCGM_EXPORTER_ENABLE_EXPORTER_METRICS", "false",
         "the exporter's own metrics; they are always served here", boolean=True,
         since="4.8.4"),
    Flag("watch-max-keep-age", "", "DCGM_EXPORTER_WATCH_MAX_KEEP_AGE", "10m",
         f"how long DCGM keeps samples (Go duration); {_DCGM}", dcgm_only=True, since="4.8.4"),
    Flag("watch-max-keep-samples", "", "DCGM_EXPORTER_WATCH_MAX_KEEP_SAMPLES", "0",
         f"samples DCGM keeps per field (0: no limit); {_DCGM}", dcgm_only=True,
         since="4.8.4"),
    # proposed after 4.8.4 (dcgm-exporter pull request 744)
    Flag("health-require-gpus", "", "DCGM_EXPORTER_HEALTH_REQUIRE_GPUS", "false",
         "/health answers 503 while no GPU is collected", boolean=True, since="PR 744"),
)
# fmt: on
BY_LONG = {f.long: f for f in DCGM_FLAGS}


class GoBool(argparse.Action):
    """A switch that also takes ``--flag=false`` (any Go boolean), as dcgm-exporter's does."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        _option_string: str | None = None,
    ) -> None:
        value = True
        if isinstance(values, str):
            try:
                value = parse_bool(values, "")
            except ValueError:
                msg = f"{values!r} is not a boolean; use true or false"
                raise argparse.ArgumentError(self, msg) from None
        setattr(namespace, self.dest, value)


def add_dcgm_flags(parser: argparse.ArgumentParser) -> None:
    """dcgm-exporter's flags, in one help group; each names its variable and default."""
    group = parser.add_argument_group(
        "dcgm-exporter flags", "same names, short aliases and environment variables"
    )
    for f in DCGM_FLAGS:
        names = ([f"-{f.short}"] if f.short else []) + [f"--{f.long}"]
        if len(f.short) > 1:
            names.append(f"--{f.short}")  # Go takes --rbmn as well as -rbmn
        text = f"{f.help} (env {f.env}; default {f.default})"
        if f.boolean:
            group.add_argument(
                *names, dest=f.dest, action=GoBool, nargs="?", metavar="BOOL", help=text
            )
        else:
            group.add_argument(*names, dest=f.dest, metavar="VALUE", help=text)


class Resolver:
    """The flag, else the environment variable, else nothing; with the source's name."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str]) -> None:
        self.args = args
        self.env = env
        self.file: dict[str, tuple[str, str]] = {}  # dest -> (value, source): --config-file
        self.config: Any = None  # the parsed --config-file (exporter/configfile.FileConfig)

    def value(self, dest: str, option: str, env_name: str) -> tuple[str | None, str]:
        """(value, "flag or environment variable NAME") or (None, "") when none is set:
        the flag, else the variable, else the config file's value."""
        given = getattr(self.args, dest)
        if given is not None:
            return str(given), option
        if self.env.get(env_name, "") != "":
            return self.env[env_name], f"environment variable {env_name}"
        return self.file.get(dest, (None, ""))

    def flag(self, long: str) -> tuple[str | None, str]:
        f = BY_LONG[long]
        return self.value(f.dest, f.option, f.env)

    def boolean(self, dest: str, env_name: str, default: bool = False) -> bool:
        """A switch: given on the command line, else the variable as a Go boolean."""
        if getattr(self.args, dest) is not None:
            return bool(getattr(self.args, dest))
        raw = self.env.get(env_name, "")
        if raw == "" and dest in self.file:
            return parse_bool(*self.file[dest])
        return default if raw == "" else parse_bool(raw, f"environment variable {env_name}")

    def dcgm_boolean(self, long: str) -> bool:
        f = BY_LONG[long]
        return self.boolean(f.dest, f.env, f.default == "true")

    def no_effect(self) -> tuple[str, ...]:
        """DCGM-only flags given (by flag or variable), validating the boolean ones."""
        given = []
        for f in DCGM_FLAGS:
            if not f.dcgm_only:
                continue
            if f.boolean:
                set_ = getattr(self.args, f.dest) is not None or self.env.get(f.env, "") != ""
                set_ = set_ or f.dest in self.file
                if set_:
                    self.dcgm_boolean(f.long)  # a bad value is still an error
            else:
                set_ = self.flag(f.long)[0] is not None
            if set_:
                given.append(f"--{f.long}")
        return tuple(given)
