"""GPU workloads: use by namespace, pod and container, shared GPUs included."""

from __future__ import annotations

from typing import Any

from grafana import (
    HOST,
    Row,
    bargauge,
    column,
    dashboard,
    query_variable,
    stat,
    table,
    target,
    timeseries,
)

NS = 'cluster=~"$cluster", namespace=~"$namespace"'
POD = 'cluster=~"$cluster", node=~"$node", namespace=~"$namespace", pod=~"$pod"'
CONTAINER = "{{namespace}}/{{pod}}/{{container}}"
SHARED_LEGEND = f"{CONTAINER} on {HOST} GPU {{{{gpu}}}}"
RULES_NOTE = " From the recording rules in alerts/gpu-recording.rules.yaml."
HELD = (
    " A container holds a whole GPU, a MIG instance, or a share of a time-sliced GPU; each "
    "counts once."
)


def _ratio(prefix: str, selector: str) -> str:
    """Mean utilization from the recorded sum and count at level `prefix`."""
    total = f"{prefix}:gpu_utilization:sum{{{selector}}}"
    count = f"{prefix}:gpu_utilization:count{{{selector}}}"
    return f"{total} / {count}"


def build() -> dict[str, Any]:
    items = [
        Row("Namespaces (all nodes)"),
        stat(
            "Namespaces using GPUs",
            "Namespaces with at least one container holding a GPU." + RULES_NOTE,
            f"count(namespace:gpu_allocations:sum{{{NS}}}) or vector(0)",
            "none",
            width=4,
        ),
        stat(
            "GPUs held",
            "Whole GPUs, MIG instances and GPU shares held by containers." + HELD + RULES_NOTE,
            f"sum(namespace:gpu_allocations:sum{{{NS}}}) or vector(0)",
            "none",
            width=4,
        ),
        stat(
            "Utilization of held GPUs",
            "Mean utilization of the GPUs held: GPU utilization for whole GPUs, engine "
            "activity for MIG instances, SM utilization for GPU shares." + RULES_NOTE,
            f"sum(namespace:gpu_utilization:sum{{{NS}}})"
            f" / sum(namespace:gpu_utilization:count{{{NS}}})",
            "percentunit",
            width=4,
        ),
        stat(
            "GPU memory used by pods",
            "Framebuffer used by containers, on whole GPUs, MIG instances and GPU shares."
            + RULES_NOTE,
            f"sum(namespace:gpu_memory_used_bytes:sum{{{NS}}}) or vector(0)",
            "bytes",
            width=4,
        ),
        stat(
            "Power of GPUs held whole",
            "Power draw of GPUs held whole by one container; MIG instances and shares have no "
            "power of their own." + RULES_NOTE,
            f"sum(namespace:gpu_power_watts:sum{{{NS}}}) or vector(0)",
            "watt",
            width=4,
        ),
        stat(
            "Energy in the time range",
            "Energy of GPUs held whole by one container over the dashboard's time range."
            + RULES_NOTE,
            f"sum(avg_over_time(namespace:gpu_energy_joules:rate5m{{{NS}}}[$__range]))"
            " * $__range_s / 3600000",
            "kwatth",
            width=4,
        ),
        timeseries(
            "GPUs held by namespace",
            "Whole GPUs, MIG instances and GPU shares held, per namespace." + HELD + RULES_NOTE,
            [target(f"namespace:gpu_allocations:sum{{{NS}}}", "{{namespace}}")],
            "none",
            stack=True,
        ),
        timeseries(
            "Utilization by namespace",
            "Mean utilization of the GPUs each namespace holds." + RULES_NOTE,
            [target(_ratio("namespace", NS), "{{namespace}}")],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "GPU memory by namespace",
            "Framebuffer used by each namespace's containers." + RULES_NOTE,
            [target(f"namespace:gpu_memory_used_bytes:sum{{{NS}}}", "{{namespace}}")],
            "bytes",
            stack=True,
        ),
        bargauge(
            "Energy by namespace in the time range",
            "Energy of the GPUs each namespace held whole over the dashboard's time range."
            + RULES_NOTE,
            [
                target(
                    f"avg_over_time(namespace:gpu_energy_joules:rate5m{{{NS}}}[$__range])"
                    " * $__range_s / 3600000",
                    "{{namespace}}",
                    instant=True,
                )
            ],
            "kwatth",
        ),
        Row("Pods and containers"),
        table(
            "Containers holding GPUs",
            "One row per container: what it holds, how busy and how much memory, and power "
            "where it holds whole GPUs." + HELD + RULES_NOTE,
            [
                target(f"node_namespace_pod_container:gpu_allocations:count{{{POD}}}"),
                target(_ratio("node_namespace_pod_container", POD)),
                target(f"node_namespace_pod_container:gpu_memory_used_bytes:sum{{{POD}}}"),
                target(f"node_namespace_pod_container:gpu_power_watts:sum{{{POD}}}"),
            ],
            "none",
            columns=[
                column("A", "GPUs held", "none"),
                column("B", "Utilization", "percentunit"),
                column("C", "Memory used", "bytes"),
                column("D", "Power", "watt"),
            ],
            hide=("cluster",),
        ),
        timeseries(
            "Utilization by container",
            "Mean utilization of the GPUs each container holds." + RULES_NOTE,
            [target(_ratio("node_namespace_pod_container", POD), CONTAINER)],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "GPU memory by container",
            "Framebuffer used by each container." + RULES_NOTE,
            [target(f"node_namespace_pod_container:gpu_memory_used_bytes:sum{{{POD}}}", CONTAINER)],
            "bytes",
        ),
        table(
            "Idle in the last hour",
            "Containers whose GPUs averaged under 1% utilization over the last hour: "
            "candidates for the GPUAllocatedButIdle alert." + RULES_NOTE,
            [
                target(
                    "avg_over_time(node_namespace_pod_container:gpu_utilization:sum"
                    f"{{{POD}}}[1h]) / avg_over_time("
                    f"node_namespace_pod_container:gpu_utilization:count{{{POD}}}[1h]) < 0.01"
                ),
            ],
            "percentunit",
            columns=[column("A", "Mean utilization", "percentunit")],
            hide=("cluster",),
        ),
        Row("Shared GPUs (time-slicing)"),
        timeseries(
            "SM utilization per container on shared GPUs",
            "Share of the GPU's streaming multiprocessors used by each container's processes "
            "on a GPU shared by time-slicing.",
            [target(f"gpu_exporter_container_sm_util_ratio{{{POD}}}", SHARED_LEGEND)],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "GPU memory per container on shared GPUs",
            "Framebuffer used by each container's processes on a GPU shared by time-slicing.",
            [target(f"gpu_exporter_container_fb_used_bytes{{{POD}}}", SHARED_LEGEND)],
            "bytes",
        ),
    ]
    variables = [
        query_variable(
            "cluster", "Cluster", "label_values(namespace:gpu_allocations:sum, cluster)"
        ),
        query_variable(
            "node",
            "Node",
            "label_values(node_namespace_pod_container:gpu_allocations:count"
            '{cluster=~"$cluster"}, node)',
        ),
        query_variable(
            "namespace",
            "Namespace",
            'label_values(namespace:gpu_allocations:sum{cluster=~"$cluster"}, namespace)',
        ),
        query_variable(
            "pod",
            "Pod",
            "label_values(node_namespace_pod_container:gpu_allocations:count"
            '{cluster=~"$cluster", node=~"$node", namespace=~"$namespace"}, pod)',
        ),
    ]
    return dashboard(
        "gpu-exporter-workloads",
        "GPU / Workloads",
        "GPU use by namespace, pod and container: whole GPUs, MIG instances and shares of "
        "time-sliced GPUs. Needs the recording rules of alerts/gpu-recording.rules.yaml.",
        variables,
        items,
    )
