"""Peak memory of the exporter per deployment variant, for the DaemonSet's memory limit.

    python3 -m benchmarks.memory            # measure, print, rewrite the docs table
    python3 -m benchmarks.memory --print    # measure and print only

Each variant runs the exporter on the default simulated node (8 GPUs, 11 MIG
instances) with the fake kubelet of tests/support (pod-resources over gRPC on a Unix
socket), and where the variant needs it the fake API server (pods, ResourceSlices)
and the fixture host /proc of tests/fixtures/timeslice. The exporter collects every
``INTERVAL_MS`` and is scraped every ``SCRAPE_EVERY_S`` for ``RUN_S``; the peak is
the kernel's high-water mark of its resident set (VmHWM in /proc/PID/status), in MiB.
The table goes into docs/benchmarks.md between the memory-variants markers; the
deploy tests check that the manifests' memory limit is at least 1.5 times each peak.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.procs import ROOT, Process, free_port, http_get

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- memory-variants:begin -->"
END = "<!-- memory-variants:end -->"
FIX = ROOT / "tests" / "fixtures"
INTERVAL_MS = 1000
SCRAPE_EVERY_S = 0.5
RUN_S = 20.0
HEADROOM = 1.5


@dataclass(frozen=True)
class Variant:
    """One way the exporter is deployed: its flags and what it needs around it."""

    name: str
    what: str
    kubelet: bool = False
    api: bool = False
    flags: tuple[str, ...] = ()


VARIANTS = (
    Variant("default", "NVML only (no -k)"),
    Variant("kubelet", "-k: pod attribution from the kubelet (deploy/base)", kubelet=True),
    Variant(
        "host-pid",
        "-k and host PID accounting of shared GPUs (component shared-gpus)",
        kubelet=True,
        flags=("--host-proc", str(FIX / "timeslice" / "proc")),
    ),
    Variant(
        "api-watch",
        "-k and the API server watch of this node's pods (pod labels)",
        kubelet=True,
        api=True,
        flags=("--kubernetes-pod-labels", ".*"),
    ),
    Variant(
        "dra",
        "-k, the pod watch and ResourceSlices (component dra)",
        kubelet=True,
        api=True,
        flags=("--kubernetes-dra",),
    ),
)


def peak_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def _kubeconfig(path: Path, url: str) -> Path:
    cluster = {"name": "bench", "cluster": {"server": url}}
    user = {"name": "bench", "user": {"token": "t"}}
    context = {"name": "bench", "context": {"cluster": "bench", "user": "bench"}}
    doc = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": [user]}
    doc |= {"contexts": [context], "current-context": "bench"}
    path.write_text(json.dumps(doc))
    return path


@contextmanager
def _surroundings(v: Variant, work: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Start the fake kubelet and API server the variant needs; yield extra argv and env."""
    import yaml

    from tests.support.fakeapi import FakeAPIServer
    from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

    argv: list[str] = list(v.flags)
    env: dict[str, str] = {"KUBERNETES_SERVICE_HOST": ""}
    kubelet = api = None
    try:
        if v.kubelet:
            ids = fleet_ids(None)
            kubelet = FakeKubelet(work / "k.sock", load_pods("default-node.yaml", ids)).start()
            argv += ["-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path)]
        if v.api:
            pods = [d for d in yaml.safe_load_all((FIX / "timeslice" / "pods.yaml").read_text())]
            slices = [
                d for d in yaml.safe_load_all((FIX / "dra" / "resourceslices.yaml").read_text())
            ]
            api = FakeAPIServer(pods=[p for p in pods if p], slices=[s for s in slices if s])
            api.start()
            env["KUBECONFIG"] = str(_kubeconfig(work / "kubeconfig", api.url))
        yield argv, env
    finally:
        if api is not None:
            api.stop()
        if kubelet is not None:
            kubelet.close()


def measure(v: Variant) -> float:
    """Peak RSS in MiB of one exporter run of variant ``v``."""
    with tempfile.TemporaryDirectory() as tmp, _surroundings(v, Path(tmp)) as (extra, env):
        port = free_port()
        argv = [sys.executable, "-m", "exporter", "--simulate", "-a", f"127.0.0.1:{port}"]
        argv += ["-c", str(INTERVAL_MS), "--log-level", "warning", *extra]
        with Process(
            argv, port, env={"NODE_NAME": "bench-node", **env}, log=Path(tmp) / "log"
        ) as p:
            p.wait_http("/ready")
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                http_get(p.url + "/metrics")
                time.sleep(SCRAPE_EVERY_S)
            return peak_mib(p.pid)


def table(peaks: dict[str, float]) -> str:
    """The Markdown table of measured peaks, with the limit each needs."""
    rows = [
        "| variant | what runs | peak RSS (MiB) | 1.5 x peak (MiB) |",
        "|---|---|---:|---:|",
    ]
    for v in VARIANTS:
        peak = peaks[v.name]
        rows.append(f"| {v.name} | {v.what} | {peak:.1f} | {peak * HEADROOM:.1f} |")
    return "\n".join(rows)


def block(peaks: dict[str, float]) -> str:
    """The docs section between the markers, markers included."""
    intro = (
        "Peak resident memory (VmHWM) per deployment variant, measured by "
        "`python3 -m benchmarks.memory` on the default simulated node, collecting every "
        f"{INTERVAL_MS} ms and scraped every {SCRAPE_EVERY_S} s for {RUN_S:.0f} s "
        f"(Python {platform.python_version()}). The DaemonSet's memory limit is at least "
        "1.5 times the peak of every variant it runs (tests/deploy/test_memory_limits.py)."
    )
    intro = textwrap.fill(intro, width=88)
    return f"{BEGIN}\n\n### Memory per deployment variant\n\n{intro}\n\n{table(peaks)}\n\n{END}"


def parse(text: str) -> dict[str, float]:
    """Variant name -> peak MiB from the docs block (what the deploy tests read)."""
    m = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
    if not m:
        raise ValueError(f"docs/benchmarks.md has no {BEGIN} ... {END} block")
    out = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"[0-9.]+", cells[2]):
            out[cells[0]] = float(cells[2])
    return out


def write(peaks: dict[str, float], doc: Path = DOC) -> None:
    """Replace the block in ``doc``, or append it at the end."""
    text = doc.read_text()
    new = block(peaks)
    if BEGIN in text and END in text:
        start, stop = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + new + text[stop:]
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    peaks = {}
    for v in VARIANTS:
        peaks[v.name] = measure(v)
        print(f"{v.name:10} {peaks[v.name]:7.1f} MiB", flush=True)
    print(table(peaks))
    if not args.print:
        write(peaks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
