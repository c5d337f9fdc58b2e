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

from exporter.config import DEFAULT_SOCKET, parse_bool


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
         "metrics file in dcgm-exporter's CSV format"),
    Flag("address", "a", "DCGM_EXPORTER_LISTEN", ":9400", "listen address [host]:port"),
    Flag("collect-interval", "c", "DCGM_EXPORTER_INTERVAL", "30000",
         "collection interval in milliseconds"),
    Flag("kubernetes", "k", "DCGM_EXPORTER_KUBERNETES", "false",
         "add pod, namespace and container labels from the kubelet", boolean=True),
    Flag("use-old-namespace", "o", "DCGM_EXPORTER_USE_OLD_NAMESPACE", "false",
         "serve dcgm-exporter 1.x metric names (dcgm_gpu_temp, ...)", boolean=True),
    Flag("cpu-devices", "p", "DCGM_EXPORTER_CPU_DEVICES_STR", "f", f"CPU devices; {_DCGM}",
         dcgm_only=True),
    Flag("configmap-data", "m", "DCGM_EXPORTER_CONFIGMAP_DATA", "none",
         f"metrics from a ConfigMap via the API server; {_DCGM} (use -f)", dcgm_only=True),
    Flag("remote-hostengine-info", "r", "DCGM_REMOTE_HOSTENGINE_INFO", "localhost:5555",
         f"remote nv-hostengine; {_DCGM}", dcgm_only=True),
    Flag("kubernetes-enable-pod-labels", "", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
         "false", "copy pod labels under their own (sanitized) names (needs the API server)",
         boolean=True),
    Flag("kubernetes-enable-pod-uid", "", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "false",
         "add a pod_uid label (needs the API server)", boolean=True),
    Flag("kubernetes-gpu-id-type", "", "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "uid",
         "device ID form the device plugin reports (uid or device-name); both are "
         "recognised either way"),
    Flag("kubernetes-pod-label-allowlist-regex", "",
         "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", "all labels",
         "comma-separated regexes of the pod label names to copy"),
    Flag("devices", "d", "DCGM_EXPORTER_DEVICES_STR", "f",
         "devices to watch: f (each GPU, its instances with MIG), g[:IDS], i[:IDS]"),
    Flag("no-hostname", "n", "DCGM_EXPORTER_NO_HOSTNAME", "false",
         "leave out the Hostname label", boolean=True),
    Flag("switch-devices", "s", "DCGM_EXPORTER_OTHER_DEVICES_STR", "f",
         f"NVSwitch devices; {_DCGM}", dcgm_only=True),
    Flag("fake-gpus", "", "DCGM_EXPORTER_USE_FAKE_GPUS", "false",
         f"DCGM's fake GPUs; {_DCGM} (use --simulate)", boolean=True, dcgm_only=True),
    Flag("web-config-file", "", "DCGM_EXPORTER_WEB_CONFIG_FILE", "none",
         "TLS, basic auth and response headers, in exporter-toolkit's web config format; "
         "re-read when it or a file it names changes"),
    Flag("xid-count-window-size", "x", "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "300000",
         "window of DCGM_EXP_XID_ERRORS_COUNT, in milliseconds"),
    Flag("replace-blanks-in-model-name", "rbmn", "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
         "false", "replace blanks in the modelName label with '-'", boolean=True),
    Flag("debug", "", "DCGM_EXPORTER_DEBUG", "false", "log at debug level", boolean=True),
    Flag("clock-events-count-window-size", "", "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",
         "300000", "window of DCGM_EXP_CLOCK_EVENTS_COUNT, in milliseconds"),
    Flag("enable-dcgm-log", "", "DCGM_EXPORTER_ENABLE_DCGM_LOG", "false",
         f"DCGM's own log; {_DCGM}", boolean=True, dcgm_only=True),
    Flag("dcgm-log-level", "", "DCGM_EXPORTER_DCGM_LOG_LEVEL", "NONE",
         f"DCGM's log level; {_DCGM}", dcgm_only=True),
    Flag("log-format", "", "DCGM_EXPORTER_LOG_FORMAT", "text",
         "log format: text, or json (one JSON object per line)"),
    Flag("pod-resources-kubelet-socket", "", "DCGM_POD_RESOURCES_KUBELET_SOCKET",
         DEFAULT_SOCKET, "kubelet pod-resources socket"),
    Flag("hpc-job-mapping-dir", "", "DCGM_HPC_JOB_MAPPING_DIR", "none",
         "HPC job files mapping jobs to GPUs; not supported, accepted, no effect",
         dcgm_only=True),
    Flag("nvidia-resource-names", "", "NVIDIA_RESOURCE_NAMES", "none",
         "extra resource names holding NVIDIA GPUs, comma-separated, * allowed; "
         "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-* are always read"),
    Flag("kubernetes-virtual-gpus", "", "KUBERNETES_VIRTUAL_GPUS", "false",
         "one series per pod sharing a time-sliced or MPS GPU", boolean=True),
    Flag("dump-enabled", "", "DCGM_EXPORTER_DUMP_ENABLED", "false",
         f"dump DCGM responses to files; {_DCGM}", boolean=True, dcgm_only=True),
    Flag("dump-directory", "", "DCGM_EXPORTER_DUMP_DIRECTORY", "/tmp/dcgm-exporter-debug",
         f"where dumps go; {_DCGM}", dcgm_only=True),
    Flag("dump-retention", "", "DCGM_EXPORTER_DUMP_RETENTION", "24",
         f"hours dumps are kept; {_DCGM}", dcgm_only=True),
    Flag("dump-compression", "", "DCGM_EXPORTER_DUMP_COMPRESSION", "true",
         f"compress dumps; {_DCGM}", boolean=True, dcgm_only=True),
    Flag("kubernetes-enable-dra", "", "KUBERNETES_ENABLE_DRA", "false",
         "attribute DRA claims of gpu.nvidia.com (needs the API server); "
         "same as --kubernetes-dra", boolean=True),
    Flag("disable-startup-validate", "", "DISABLE_STARTUP_VALIDATE", "false",
         f"skip DCGM's startup checks; {_DCGM}", boolean=True, dcgm_only=True),
    Flag("enable-gpu-bind-unbind-watch", "", "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH",
         "false", f"watch GPU bind/unbind; {_DCGM} (GPUs are enumerated every cycle)",
         boolean=True, dcgm_only=True),
    Flag("gpu-bind-unbind-poll-interval", "", "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL",
         "1s", f"poll interval of that watch; {_DCGM}", dcgm_only=True),
    Flag("enable-pprof", "", "DCGM_EXPORTER_ENABLE_PPROF", "false",
         "Go profiling endpoints; not applicable to this exporter, accepted, no effect",
         boolean=True, dcgm_only=True),
    Flag("web-systemd-socket", "", "DCGM_EXPORTER_SYSTEMD_SOCKET", "false",
         "listen on a socket systemd passes (LISTEN_FDS); not supported: accepted, logged, "
         "the exporter listens on --address", boolean=True),
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

    def value(self, dest: str, option: str, env_name: str) -> tuple[str | None, str]:
        """(value, "flag or environment variable NAME") or (None, "") when neither is set."""
        given = getattr(self.args, dest)
        if given is not None:
            return str(given), option
        if self.env.get(env_name, "") != "":
            return self.env[env_name], f"environment variable {env_name}"
        return None, ""

    def flag(self, long: str) -> tuple[str | None, str]:
        f = BY_LONG[long]
        return self.value(f.dest, f.option, f.env)

    def boolean(self, dest: str, env_name: str, default: bool = False) -> bool:
        """A switch: given on the command line, else the variable as a Go boolean."""
        if getattr(self.args, dest) is not None:
            return bool(getattr(self.args, dest))
        raw = self.env.get(env_name, "")
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
                if set_:
                    self.dcgm_boolean(f.long)  # a bad value is still an error
            else:
                set_ = self.flag(f.long)[0] is not None
            if set_:
                given.append(f"--{f.long}")
        return tuple(given)
