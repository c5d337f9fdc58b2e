"""Walking devices through pynvml the way an exporter does."""

from __future__ import annotations

import pynvml


def handle(index: int) -> pynvml.c_nvmlDevice_t:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def mig_handles(parent) -> list:
    """MIG handles under a parent, skipping empty indexes like a careful caller does."""
    out = []
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            out.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        except pynvml.NVMLError_NotFound:
            continue
    return out
