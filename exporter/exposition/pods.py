"""Pod label joins: the labels of the container holding a device, and per-container series.

workloads/ hands over plain records (exporter/frame.py: a device's holder, per-container
splits of a shared device); this module turns them into label text, escaped once and
cached while the holder stays the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from exporter.exposition import text
from exporter.frame import Holder, Owner, Split, Unhealthy
from exporter.nvml.devices import Device

CACHE_MAX = 4096  # holders whose label text is kept; past it the cache starts over

FB = "gpu_exporter_container_fb_used_bytes"
SM = "gpu_exporter_container_sm_util_ratio"
UNHEALTHY = "gpu_exporter_pod_device_unhealthy"
HELP = {
    FB: "Framebuffer used by the container's processes on a shared GPU or MIG instance (bytes).",
    SM: "SM utilization of the container's processes on a shared GPU (ratio 0-1 of the GPU).",
    UNHEALTHY: "1: the container holds a GPU or MIG instance its DRA driver calls unhealthy "
    "(source: taint, a NoSchedule/NoExecute ResourceSlice device taint; pod_status, "
    "the pod's allocatedResourcesStatus).",
}
MIB = 1024 * 1024  # the shares come in MiB and percent, as the DCGM copies need them


def holder_pairs(h: Holder) -> list[tuple[str, str]]:
    """Label pairs of a device held by one container, in dcgm-exporter's order."""
    o = h.owner
    pairs = [("pod", o.pod), ("namespace", o.namespace), ("container", o.container)]
    if h.pod_uid:
        pairs.append(("pod_uid", h.pod_uid))
    if h.vgpu:
        pairs.append(("vgpu", h.vgpu))
    pairs += dra_pairs(o)
    pairs.extend(h.labels)
    return pairs


def dra_pairs(o: Owner) -> list[tuple[str, str]]:
    """dcgm-exporter's DRA labels of a container holding its device through a claim: the
    claim and the device's driver, pool and name; its MIG profile and UUID on a MIG device."""
    if not o.claim:
        return []
    pairs = [
        ("dra_claim_name", o.claim),
        ("dra_claim_namespace", o.claim_namespace),
        ("dra_driver_name", o.driver),
        ("dra_pool_name", o.pool),
        ("dra_device_name", o.device),
    ]
    if o.mig_profile or o.mig_uuid:
        pairs += [("dra_mig_profile", o.mig_profile), ("dra_mig_device_uuid", o.mig_uuid)]
    return pairs


class HolderText:
    """Label text per holder, escaped once and reused across cycles.

    Each :meth:`by_device` (a new layout of holders) keeps only the holders it is given:
    the text of pods that are gone is dropped with them, not kept until the cache fills
    (with pods replaced all day, a full cache held a few MiB of gone pods' strings)."""

    def __init__(self, names: Mapping[str, str] | None = None) -> None:
        self._cache: dict[Holder, str] = {}
        self.names = names or {}  # label name -> the name served (-o: text.OLD_LABELS)

    def __call__(self, h: Holder) -> str:
        got = self._cache.get(h)
        if got is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            got = self._cache[h] = text.join(text.renamed(holder_pairs(h), self.names))
        return got

    def nobody(self) -> str:
        """The pod labels of a device no container holds, each empty (``pod=""``): under an
        annotation scrape with honor_labels, an absent label would take the exporter's own
        pod from the target, while an empty one blocks it and is stored as absent."""
        return text.join(text.renamed([(k, "") for k in text.POD_LABELS], self.names))

    def by_device(self, holders: Mapping[str, Holder]) -> dict[str, str]:
        """Label text per device key; from now on only these holders are kept."""
        last, self._cache = self._cache, {}
        for h in holders.values():
            got = last.get(h)
            if got is not None:
                self._cache[h] = got
        return {key: self(h) for key, h in holders.items()}


def _owner_text(o: Owner) -> str:
    return text.join((("pod", o.pod), ("namespace", o.namespace), ("container", o.container)))


def shared_families(splits: Iterable[Split], device_text: Callable[..., str]) -> tuple[str, int]:
    """Text and series count of the per-container families of shared devices."""
    lines: dict[str, list[str]] = {FB: [], SM: []}
    for s in splits:
        dev = device_text(s.device)
        for o, v in s.fb.items():
            lines[FB].append(text.sample(FB, f"{dev},{_owner_text(o)}", str(round(v * MIB))))
        for o, v in s.sm.items():
            lines[SM].append(text.sample(SM, f"{dev},{_owner_text(o)}", repr(round(v / 100, 5))))
    out = [text.family(name, HELP[name], "gauge", ls) for name, ls in lines.items()]
    return "".join(out), len(lines[FB]) + len(lines[SM])


def unhealthy_family(
    unhealthy: Mapping[str, tuple[Unhealthy, ...]],
    devices: Iterable[Device],
    device_text: Callable[..., str],
) -> tuple[str, int]:
    """Text and series count of the family of containers on devices their DRA driver
    calls unhealthy (one series per container, device, source and reason)."""
    if not unhealthy:
        return "", 0
    lines = []
    for d in {d.key: d for d in devices}.values():  # whole GPUs are among the entities too
        for u in unhealthy.get(d.key, ()):
            o = u.owner
            pairs = [*dra_pairs(o), ("source", u.source), ("reason", u.reason)]
            lines.append(
                text.sample(UNHEALTHY, f"{device_text(d)},{_owner_text(o)},{text.join(pairs)}", "1")
            )
    return text.family(UNHEALTHY, HELP[UNHEALTHY], "gauge", lines), len(lines)
