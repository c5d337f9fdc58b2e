"""GPU fleet overview: cluster, node and GPU level, MIG-aware."""

from __future__ import annotations

from typing import Any

from grafana import (
    GPU_SELECTOR,
    HOST,
    NODE_SELECTOR,
    Row,
    bargauge,
    column,
    dashboard,
    dashed,
    gpu_variables,
    stat,
    table,
    target,
    timeseries,
)

N = NODE_SELECTOR
G = GPU_SELECTOR
GPU_LEGEND = f"{HOST} GPU {{{{gpu}}}}"
INSTANCE_LEGEND = f"{HOST} GPU {{{{gpu}}}} {{{{GPU_I_PROFILE}}}} {{{{GPU_I_ID}}}}"
RULES_NOTE = " From the recording rules in alerts/gpu-recording.rules.yaml."
MIG_NOTE = " A MIG-enabled GPU shows once: its instances repeat the GPU's value."


def _per_gpu(expr: str) -> str:
    """One series per physical GPU: a MIG GPU's device-level fields repeat per instance."""
    return f"max by (Hostname, hostname, gpu, UUID) ({expr})"


def _node(record: str) -> str:
    """A node-level recorded series, filtered by the cluster and node variables."""
    return f"node:{record}{{{N}}}"


MEMORY_RATIO = f"{_node('gpu_memory_used_bytes:sum')} / {_node('gpu_memory_total_bytes:sum')}"
UTILIZATION_RATIO = f"{_node('gpu_utilization:sum')} / {_node('gpu_utilization:count')}"


def build() -> dict[str, Any]:
    items = [
        Row("Fleet"),
        stat(
            "Nodes",
            "Nodes with GPUs reporting." + RULES_NOTE,
            f"count(count by (cluster, node, Hostname, hostname) ({_node('gpu_devices:count')}))",
            "none",
        ),
        stat(
            "GPUs",
            "Physical GPUs reporting. A GPU split into MIG instances counts once." + RULES_NOTE,
            f"sum({_node('gpu_devices:count')})",
            "none",
        ),
        stat(
            "MIG instances",
            "MIG instances configured on MIG-enabled GPUs." + RULES_NOTE,
            f"sum(node_mig_profile:gpu_mig_instances:count{{{N}}}) or vector(0)",
            "none",
        ),
        stat(
            "Held by pods",
            "Share of schedulable units (whole GPUs and MIG instances) held by a pod. Shares "
            "of time-sliced GPUs are not counted here." + RULES_NOTE,
            f"(sum({_node('gpu_instances_allocated:count')}) or vector(0))"
            f" / sum({_node('gpu_instances:count')})",
            "percentunit",
        ),
        stat(
            "Utilization",
            "Mean GPU utilization of whole (non-MIG) GPUs: the share of time a kernel was "
            "running. MIG instances are shown by profile below." + RULES_NOTE,
            f"sum({_node('gpu_utilization:sum')}) / sum({_node('gpu_utilization:count')})",
            "percentunit",
        ),
        stat(
            "Memory used",
            "Framebuffer in use over framebuffer available, over all GPUs and MIG instances."
            + RULES_NOTE,
            f"sum({_node('gpu_memory_used_bytes:sum')})"
            f" / sum({_node('gpu_memory_total_bytes:sum')})",
            "percentunit",
        ),
        stat(
            "Power",
            "Total power draw of the GPUs now." + RULES_NOTE,
            f"sum({_node('gpu_power_watts:sum')})",
            "watt",
        ),
        stat(
            "Energy in the time range",
            "Energy used by the GPUs over the dashboard's time range, from their energy "
            "counters." + RULES_NOTE,
            f"sum(avg_over_time({_node('gpu_energy_joules:rate5m')}[$__range]))"
            " * $__range_s / 3600000",
            "kwatth",
        ),
        Row("Nodes"),
        timeseries(
            "Utilization by node",
            "Mean GPU utilization of the whole (non-MIG) GPUs of each node." + RULES_NOTE,
            [target(UTILIZATION_RATIO, HOST)],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "Memory used by node",
            "Framebuffer in use over framebuffer available on each node, GPUs and MIG "
            "instances together." + RULES_NOTE,
            [target(MEMORY_RATIO, HOST)],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "Power by node",
            "Power draw of each node's GPUs, with the sum of their enforced power limits "
            "dashed." + RULES_NOTE,
            [
                target(_node("gpu_power_watts:sum"), HOST),
                target(_node("gpu_power_limit_watts:sum"), f"{HOST} limit"),
            ],
            "watt",
            overrides=[dashed(" limit$")],
        ),
        bargauge(
            "Energy by node in the time range",
            "Energy used by each node's GPUs over the dashboard's time range, from their "
            "energy counters." + RULES_NOTE,
            [
                target(
                    f"avg_over_time({_node('gpu_energy_joules:rate5m')}[$__range])"
                    " * $__range_s / 3600000",
                    HOST,
                    instant=True,
                )
            ],
            "kwatth",
        ),
        table(
            "Nodes",
            "One row per node: GPUs, whole GPUs and MIG instances held by pods, utilization, "
            "memory, power and the hottest GPU." + RULES_NOTE,
            [
                target(f"sum without (modelName) ({_node('gpu_devices:count')})"),
                target(
                    f"({_node('gpu_instances_allocated:count')}"
                    f" or {_node('gpu_instances:count')} * 0) / {_node('gpu_instances:count')}"
                ),
                target(UTILIZATION_RATIO),
                target(MEMORY_RATIO),
                target(_node("gpu_power_watts:sum")),
                target(_node("gpu_temperature_celsius:max")),
            ],
            "none",
            columns=[
                column("A", "GPUs", "none"),
                column("B", "Held by pods", "percentunit"),
                column("C", "Utilization", "percentunit"),
                column("D", "Memory used", "percentunit"),
                column("E", "Power", "watt"),
                column("F", "Hottest GPU", "celsius"),
            ],
        ),
        Row("MIG"),
        timeseries(
            "MIG instances by profile",
            "MIG instances configured, and held by pods, for each profile." + RULES_NOTE,
            [
                target(
                    f"sum by (GPU_I_PROFILE) (node_mig_profile:gpu_mig_instances:count{{{N}}})",
                    "{{GPU_I_PROFILE}}",
                ),
                target(
                    "sum by (GPU_I_PROFILE) "
                    f"(node_mig_profile:gpu_mig_instances_allocated:count{{{N}}})",
                    "{{GPU_I_PROFILE}} held",
                ),
            ],
            "none",
            overrides=[dashed(" held$")],
        ),
        timeseries(
            "MIG engine activity by profile",
            "Mean graphics engine activity of the MIG instances of each profile (Hopper and "
            "newer; older GPUs report no per-instance activity)." + RULES_NOTE,
            [
                target(
                    f"sum by (GPU_I_PROFILE) (node_mig_profile:gpu_utilization:sum{{{N}}})"
                    f" / sum by (GPU_I_PROFILE) (node_mig_profile:gpu_utilization:count{{{N}}})",
                    "{{GPU_I_PROFILE}}",
                )
            ],
            "percentunit",
            maximum=1,
        ),
        # Per-device series: collapsed, so the fleet view queries per-node series only.
        Row("GPUs of the selected nodes (per device: pick nodes first)", collapsed=True),
        timeseries(
            "GPU utilization",
            "Share of time a kernel was running on each whole GPU. MIG-enabled GPUs have no "
            "such value; see engine activity.",
            [target(f"DCGM_FI_DEV_GPU_UTIL{{{G}}}", GPU_LEGEND)],
            "percent",
            maximum=100,
        ),
        timeseries(
            "Engine activity per GPU and MIG instance",
            "Share of time the graphics engine was active, for each whole GPU and each MIG "
            "instance (Hopper and newer).",
            [target(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{G}}}", INSTANCE_LEGEND)],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "Framebuffer used per GPU and MIG instance",
            "GPU memory in use on each whole GPU and each MIG instance.",
            [target(f"DCGM_FI_DEV_FB_USED{{{G}}} * 1048576", INSTANCE_LEGEND)],
            "bytes",
        ),
        timeseries(
            "Temperature",
            "GPU die temperature." + MIG_NOTE,
            [target(_per_gpu(f"DCGM_FI_DEV_GPU_TEMP{{{G}}}"), GPU_LEGEND)],
            "celsius",
            minimum=None,
        ),
        timeseries(
            "Power draw",
            "Power draw of each GPU." + MIG_NOTE,
            [target(_per_gpu(f"DCGM_FI_DEV_POWER_USAGE{{{G}}}"), GPU_LEGEND)],
            "watt",
        ),
        timeseries(
            "SM clock",
            "Streaming multiprocessor clock of each GPU." + MIG_NOTE,
            [target(_per_gpu(f"DCGM_FI_DEV_SM_CLOCK{{{G}}}") + " * 1000000", GPU_LEGEND)],
            "hertz",
        ),
        timeseries(
            "PCIe throughput",
            "Bytes per second over each GPU's PCIe link, transmitted and received (MIG "
            "instances of a GPU summed; Hopper and newer).",
            [
                target(
                    f"sum by (Hostname, hostname, gpu) (DCGM_FI_PROF_PCIE_TX_BYTES{{{G}}})",
                    f"{GPU_LEGEND} tx",
                ),
                target(
                    f"sum by (Hostname, hostname, gpu) (DCGM_FI_PROF_PCIE_RX_BYTES{{{G}}})",
                    f"{GPU_LEGEND} rx",
                ),
            ],
            "Bps",
        ),
        timeseries(
            "NVLink throughput",
            "Bytes per second over each GPU's NVLinks, sent and received together "
            "(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is already a throughput, KiB/s / 1000, as "
            "DCGM computes it; max, not sum: MIG instances repeat their GPU's value).",
            [
                target(
                    "max by (Hostname, hostname, gpu) (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
                    f"{{{G}}}) * 1024000",
                    GPU_LEGEND,
                ),
            ],
            "Bps",
        ),
    ]
    return dashboard(
        "gpu-exporter-fleet",
        "GPU / Fleet overview",
        "GPUs across clusters and nodes: how many, how busy, memory, power and energy; "
        "MIG-aware. Needs the recording rules of alerts/gpu-recording.rules.yaml: every panel "
        "outside the collapsed per-GPU row reads per-node recorded series.",
        gpu_variables("node:gpu_devices:count"),
        items,
    )
