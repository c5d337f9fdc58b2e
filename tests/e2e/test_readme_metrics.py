"""README names only metrics the exporter serves.

A simulated node with pod attribution (-k against the fake kubelet) and the default
metrics file is scraped; every metric name README.md writes in backticks
(``gpu_exporter_*``, ``DCGM_FI_*``, ``DCGM_EXP_*``) must be in that scrape, as a
metric or as a label, or be said in its sentence to appear only under a condition.
"""

from __future__ import annotations

import re

from tests.procs import ROOT, Exporter
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

NAME = re.compile(r"`((?:gpu_exporter|DCGM_FI|DCGM_EXP)_[A-Za-z0-9_]+)")
# words by which a README sentence says that a series exists only sometimes
# the scrape is taken once these are there: GPM needs two cycles, shared-GPU
# containers the kubelet's answer and a cycle's processes
WAIT_FOR = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    'collector="podresources"',
    "gpu_exporter_container_fb_used_bytes",
)
CONDITIONAL = re.compile(r"\b(only|when|seen|With `-)", re.IGNORECASE)


def served_names(text: str) -> set[str]:
    """Metric family names and label names of an exposition."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
            names.update(re.findall(r"[{,]([A-Za-z_][A-Za-z0-9_]*)=", line))
    return names


def readme_sentences() -> list[str]:
    """README.md's prose, one sentence per item (code blocks left out)."""
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    return [s for s in re.split(r"(?<=[.:])\s+|\n\s*\n|\n\|", text) if NAME.search(s)]


def former_names() -> set[str]:
    """The names README's table of changed metrics gives up (first column, where the
    second names another)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Changes to metric names", 1)[1].split("\n#", 1)[0]
    rows = [row.split("|")[1:3] for row in section.splitlines() if row.startswith("| `")]
    pairs = [(NAME.search(before).group(1), NAME.search(now).group(1)) for before, now in rows]
    return {before for before, now in pairs if before != now}


def test_readme_lists_only_served_metrics(tmp_path):
    kubelet = FakeKubelet(tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None)))
    kubelet.start()
    try:
        exp = Exporter(
            "-c", "300", "-k", "--pod-resources-kubelet-socket", str(kubelet.socket_path)
        )
        try:
            exp.wait_ready()
            text = exp.wait_metrics(
                lambda t: all(n in t for n in WAIT_FOR),
                20,
                "GPM values and pod attribution of shared GPUs",
            )
        finally:
            exp.stop()
    finally:
        kubelet.close()
    served = served_names(text)
    unexplained = sorted(
        {
            name
            for sentence in readme_sentences()
            for name in NAME.findall(sentence)
            if name not in served and not CONDITIONAL.search(sentence)
        }
        - former_names()
    )
    assert not unexplained, (
        f"README.md names {unexplained}, which a simulated node with -k does not serve; "
        "remove them or say in their sentence when they appear"
    )
    # the renamed families are gone under their former names
    assert former_names() and not former_names() & served
    # the check sees README's self-metrics at all
    assert {"gpu_exporter_build_info", "gpu_exporter_kubelet_up"} <= served
