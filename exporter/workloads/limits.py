"""Bounds on what the kubelet and the API server may make the exporter hold or log.

Both are trusted to be well-behaved, but a broken or hostile one (or a tenant
who controls pod labels) must not be able to stop collection, grow memory
without bound, create unbounded series or flood the log. Every input has a
bound below; what goes past one is dropped, counted in
``gpu_exporter_kube_inputs_dropped_total{input}`` and logged at most
``LOG_LINES_PER_MINUTE`` times a minute.

The defaults leave room for the largest nodes Kubernetes supports (kubelet
``--max-pods`` up to a few hundred, labels of at most 63-character values)
with a wide margin.
"""

from __future__ import annotations

import threading
from collections import Counter

# warnings about bad kubelet or API-server input a minute, per logger: the shared bound
from exporter.runtime.ratelimit import LOG_LINES_PER_MINUTE as LOG_LINES_PER_MINUTE

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest pod-resources ``List`` answer accepted from the kubelet (its message, bytes;
a node of 250 pods with 8 GPUs each answers in well under 100 KiB)."""

MAX_KUBELET_PODS = 2000
"""Pods of one kubelet ``List`` answer that are looked at; the rest are dropped."""

MAX_CONTAINERS_PER_POD = 128
"""Containers of one pod (kubelet answer or API object) that are looked at."""

MAX_DEVICE_IDS = 20_000
"""Device IDs (device-plugin IDs, DRA devices and their CDI names) of one kubelet ``List``
answer that are looked at."""

MAX_DEVICE_ENTRIES = 32_768
"""Device entries (one per container and resource name, and one per DRA claim) of one
kubelet ``List`` answer that are looked at."""

MAX_LIST_FIELDS = 200_000
"""Fields of one kubelet ``List`` answer walked, at any depth (a node of 250 pods with a
few containers each has a few thousand); past it the rest of the answer is dropped."""

MAX_RESOURCE_NAMES = 256
"""Distinct resource names of one kubelet ``List`` answer that are looked at."""

MAX_DEVICE_ID_CHARS = 256
"""Longest device ID parsed; longer ones are malformed."""

MAX_UNMATCHED_RESOURCES = 32
"""Distinct ``resource`` label values of the unmatched-ID counter; later ones count under
``OTHER``."""

OTHER = "other"
"""The ``resource`` label value for unmatched IDs past ``MAX_UNMATCHED_RESOURCES``."""

MAX_PODS = 2000
"""Pods kept in the API-server pod index; pods past it are left out (no UID, no labels)."""

MAX_LIST_BYTES = 8 * 1024 * 1024
"""Largest API-server list answer read (bytes); a larger one is refused and retried."""

MAX_WATCH_LINE_BYTES = 4 * 1024 * 1024
"""Longest watch event line (bytes; etcd stores objects up to 1.5 MiB); a longer one
ends the watch, which lists again after a backoff."""

MAX_POD_LABELS = 64
"""Pod labels copied per pod; labels past it (in name order) are dropped."""

MAX_LABEL_NAME_CHARS = 128
"""Longest pod label name copied (after sanitizing); longer ones are dropped."""

MAX_LABEL_VALUE_CHARS = 256
"""Longest pod label value copied; longer ones are cut to this length."""

MAX_NAME_CHARS = 253
"""Longest pod, namespace, container or claim name accepted (Kubernetes allows 253)."""

MAX_SLICES = 512
"""ResourceSlices kept; later ones are dropped."""

MAX_SLICE_DEVICES = 4096
"""Devices of all ResourceSlices kept; later ones are dropped."""

MAX_CLAIMS = 4096
"""ResourceClaims kept whose devices are shared by consumable capacity (apiserver/claims.py;
the watch is cluster-wide, claims of other nodes included); later ones are dropped."""


class Drops:
    """Thread-safe counts of inputs dropped at a bound, by input name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, what: str, n: int = 1) -> None:
        """Count ``n`` dropped items of the input ``what``."""
        if n > 0:
            with self._lock:
                self._counts[what] += n

    def items(self) -> list[tuple[str, int]]:
        """(input, count) pairs, sorted by input."""
        with self._lock:
            return sorted(self._counts.items())

    def __getitem__(self, what: str) -> int:
        with self._lock:
            return self._counts[what]
