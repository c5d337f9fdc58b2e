"""Strings that no valid UTF-8 can carry, and other hostile strings, through every input
that reaches a label or a help text, against the exporter process.

A JSON string escape such as ``"\\ud800"`` decodes to a lone surrogate, which UTF-8 cannot
encode; one such value from the API server once stopped the collection loop. Here the
API server serves them in pod label values and names, UIDs, pod names and namespaces
(tests/fixtures/hostile/pods.yaml); the kubelet serves invalid UTF-8 bytes in pod,
namespace and container names; a reloaded metrics file carries them in a help text. What a
user checks: /health and /ready answer 200, collection goes on, each such code point is
exported as U+FFFD, the exposition parses, and the log says so once, not once per cycle.
HPC job files and container names from a runtime socket carry them in tests/workloads/
(test_hpcjobs.py, test_containers.py): --container-labels is ignored under -k.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.config.model import default_metrics_file
from tests.procs import ROOT, Exporter, wait_until
from tests.reliability.test_kube_faults import kubeconfig
from tests.support.fakeapi import FakeAPIServer
from tests.support.fakekubelet import FakeKubelet, fleet_ids, load_pods

PODS = ROOT / "tests" / "fixtures" / "hostile" / "pods.yaml"
FRESH = re.compile(r"^gpu_exporter_last_collection_success_timestamp_seconds (\S+)$", re.M)
REPLACED = "each is exported as U+FFFD"
# names of the kubelet's answer, each rewritten to the same number of bytes that are not
# UTF-8 (a surrogate as CESU-8 writes it, a stray continuation byte, an overlong slash)
INVALID = {b"train-0": b"tr\xed\xa0\x80n0", b"serving": b"ser\x80ing", b"trainer": b"tra\xc0\xafer"}


class CorruptKubelet(FakeKubelet):
    """The fake kubelet; once ``corrupt`` is set, its answers carry invalid UTF-8 names."""

    corrupt = False

    def _bytes(self, resp: object) -> bytes:
        data = super()._bytes(resp)
        for good, bad in INVALID.items() if self.corrupt else ():
            data = data.replace(good, bad)
        return data


@pytest.fixture
def node(tmp_path):
    kubelet = CorruptKubelet(
        tmp_path / "k.sock", load_pods("default-node.yaml", fleet_ids(None))
    ).start()
    api = FakeAPIServer([d for d in yaml.safe_load_all(PODS.read_text()) if d]).start()
    metrics = tmp_path / "metrics.csv"
    metrics.write_text(Path(default_metrics_file()).read_text())
    exp = Exporter(
        "-c", "300", "-f", str(metrics), "-k", "--pod-resources-kubelet-socket",
        str(kubelet.socket_path), "--kubernetes-enable-pod-labels",
        "--kubernetes-enable-pod-uid", log=tmp_path / "log",
        env={
            "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url)),
            "KUBERNETES_SERVICE_HOST": "",
            "NODE_NAME": "node-a",
        },
    )  # fmt: skip
    try:
        yield exp, kubelet, metrics
    finally:
        output = exp.stop()
        api.stop()
        kubelet.close()
        assert "Traceback" not in output, output[-3000:]


def find(text: str, name: str, **labels: str) -> list:
    """Samples of ``name`` with ``labels``, read by prometheus-client's parser (which, as
    Prometheus, ends lines at LF only: U+2028 in a value is no line end)."""
    return [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _healthy(exp: Exporter) -> str:
    """/health and /ready 200, a fresh cycle, an exposition that parses: its text."""
    assert exp.get("/health")[0] == 200
    status, _, body = exp.get("/ready")
    assert status == 200, body
    first = float(FRESH.search(exp.metrics()).group(1))
    wait_until(lambda: float(FRESH.search(exp.metrics()).group(1)) > first, 5, "a fresh cycle")
    text = exp.metrics()
    assert find(text, "DCGM_FI_DEV_GPU_TEMP")  # and the whole text parses
    return text


def test_hostile_strings_from_the_api_server_kubelet_and_metrics_file(node):
    exp, kubelet, metrics = node
    exp.wait_ready()
    text = exp.wait_metrics(lambda t: "lone_high=" in t, 15, "the API server's pod labels")
    (gpu0,) = [s for s in find(text, "DCGM_FI_DEV_GPU_TEMP") if s.labels.get("pod") == "train-0"]
    assert gpu0.labels["lone_high"] == "a\ufffdb"
    assert gpu0.labels["lone_low"] == "\ufffd"
    assert gpu0.labels["reversed_pair"] == "\ufffd\ufffd"
    assert gpu0.labels["pair"] == "\U0001f600"  # JSON's escaped pair is one valid code point
    assert gpu0.labels["pod_uid"] == "5c0ba7e2-\ufffd-4c6a"
    assert gpu0.labels["syntax"] == 'q"b\\n\nl} 1\nforged_series 1'
    assert "forged_series" not in {f.name for f in text_string_to_metric_families(text)}
    (infer,) = {s.labels["long"] for s in find(text, "DCGM_FI_DEV_GPU_TEMP", pod="infer-2")}
    assert infer.startswith("\ufffdxxx")
    _healthy(exp)
    time.sleep(1.0)  # three more cycles, each with the same values
    assert exp.output().count(REPLACED) == 1, exp.output()[-2000:]
    lines = len(exp.output().splitlines())

    # invalid UTF-8 from the kubelet, and in a reloaded metrics file's help text
    kubelet.corrupt = True
    good = metrics.read_bytes()
    metrics.write_bytes(good.replace(b"GPU temperature", b"GPU \xed\xa0\x80temperature", 1))
    exp.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "not UTF-8" in exp.output(), 5, "the metrics file refused")
    time.sleep(1.0)
    text = _healthy(exp)
    assert "\ufffd" in text  # the last good pod map and labels stay
    grown = exp.output().splitlines()[lines:]
    print("\nlog lines after the kubelet and metrics file turned invalid:", *grown, sep="\n")
    assert len(grown) <= 4, grown
    assert not find(text, "gpu_exporter_cycle_step_failures_total", step="publish")[0].value
