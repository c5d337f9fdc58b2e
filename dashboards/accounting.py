"""GPU accounting: GPU-hours, idle share, energy and cost per namespace and pod, the top
idle holders, and GPU memory held by no running container."""

from __future__ import annotations

from typing import Any

from grafana import HOST, Row, bargauge, column, dashboard, query_variable, stat, table, target
from grafana import timeseries as series

NS = 'cluster=~"$cluster", namespace=~"$namespace"'
POD = 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"'
CLUSTER = 'cluster=~"$cluster"'
RULES = " From the recording rules in alerts/gpu-accounting.rules.yaml (docs/accounting.md)."
HOURS = (
    " A whole GPU held for an hour is one GPU-hour; a MIG instance counts its compute slices "
    "over the GPU's (1g on an H100: a seventh), a share of a time-sliced GPU its part."
)
POD_LEGEND = "{{namespace}}/{{pod}}"
DEVICE_LEGEND = f"{HOST} GPU {{{{gpu}}}} {{{{gpu_i_profile}}}} {{{{gpu_i_id}}}}"


def _namespaces() -> list[Any]:
    return [
        Row("Namespaces"),
        stat(
            "GPU-hours, last day",
            "GPU-hours held by pods in the last 24 hours." + HOURS + RULES,
            f"sum(namespace:gpu_allocated_hours:increase1d{{{NS}}})",
            "none",
            width=4,
        ),
        stat(
            "Idle share, last day",
            "Of the GPU-hours held in the last 24 hours, the part during which the holder "
            "ran nothing on its GPU or stayed under the exporter's idle threshold." + RULES,
            f"sum(namespace:gpu_idle_hours:increase1d{{{NS}}})"
            f" / sum(namespace:gpu_allocated_hours:increase1d{{{NS}}})",
            "percentunit",
            width=4,
        ),
        stat(
            "Busy GPU-hours, last day",
            "GPU-hours held, weighted by measured activity (utilization, SM activity)." + RULES,
            f"sum(namespace:gpu_busy_hours:increase1d{{{NS}}})",
            "none",
            width=4,
        ),
        stat(
            "Energy, last day",
            "Energy charged to pods in the last 24 hours: their GPUs' energy, split by "
            "allocation on MIG and by measured SM share on shared GPUs." + RULES,
            f"sum(namespace:gpu_energy_kwh:increase1d{{{NS}}})",
            "kwatth",
            width=4,
        ),
        stat(
            "Cost, last day",
            "GPU-hours times the price of a GPU-hour set in alerts/config.yaml." + RULES,
            f"sum(namespace:gpu_cost:increase1d{{{NS}}})",
            "none",
            width=4,
        ),
        stat(
            "GPU memory held by no pod",
            "GPU memory of processes that belong to no running container holding the "
            "device: dead pods' leftovers, processes outside Kubernetes.",
            f"sum(gpu_exporter_unaccounted_memory_bytes{{{CLUSTER}}}) or vector(0)",
            "bytes",
            width=4,
        ),
        series(
            "GPU-hours by namespace, per hour",
            "GPU-hours each namespace held in the hour before each point." + HOURS + RULES,
            [target(f"namespace:gpu_allocated_hours:increase1h{{{NS}}}", "{{namespace}}")],
            "none",
            stack=True,
        ),
        series(
            "Idle share by namespace",
            "Part of each namespace's GPU-hours of the last hour that was idle." + RULES,
            [
                target(
                    f"namespace:gpu_idle_hours:increase1h{{{NS}}}"
                    f" / namespace:gpu_allocated_hours:increase1h{{{NS}}}",
                    "{{namespace}}",
                )
            ],
            "percentunit",
            maximum=1,
        ),
        bargauge(
            "Energy by namespace, last day",
            "Energy charged to each namespace in the last 24 hours." + RULES,
            [target(f"namespace:gpu_energy_kwh:increase1d{{{NS}}}", "{{namespace}}", instant=True)],
            "kwatth",
        ),
        bargauge(
            "Energy by activity by namespace, last day",
            "Energy charged to each namespace in the last 24 hours with each GPU's idle power "
            "split by allocation and the power above it by measured activity: a pod that "
            "holds a GPU and runs nothing pays only its part of the idle power." + RULES,
            [
                target(
                    f"namespace:gpu_activity_energy_kwh:increase1d{{{NS}}}",
                    "{{namespace}}",
                    instant=True,
                )
            ],
            "kwatth",
        ),
        bargauge(
            "Cost by namespace, last day",
            "Each namespace's GPU-hours of the last 24 hours at the price of a GPU-hour." + RULES,
            [target(f"namespace:gpu_cost:increase1d{{{NS}}}", "{{namespace}}", instant=True)],
            "none",
        ),
    ]


def _pods() -> list[Any]:
    return [
        Row("Pods"),
        table(
            "Pods, last day",
            "Per pod, the last 24 hours: GPU-hours held, busy and idle GPU-hours, energy "
            "(by allocation and by activity) and cost." + HOURS + RULES,
            [
                target(f"namespace_pod:gpu_allocated_hours:increase1d{{{POD}}}"),
                target(f"namespace_pod:gpu_busy_hours:increase1d{{{POD}}}"),
                target(f"namespace_pod:gpu_idle_hours:increase1d{{{POD}}}"),
                target(f"namespace_pod:gpu_energy_kwh:increase1d{{{POD}}}"),
                target(f"namespace_pod:gpu_cost:increase1d{{{POD}}}"),
                target(f"namespace_pod:gpu_activity_energy_kwh:increase1d{{{POD}}}"),
            ],
            "none",
            columns=[
                column("A", "GPU-hours", "none"),
                column("B", "Busy GPU-hours", "none"),
                column("C", "Idle GPU-hours", "none"),
                column("D", "Energy", "kwatth"),
                column("E", "Cost", "none"),
                column("F", "Energy by activity", "kwatth"),
            ],
            hide=("cluster",),
        ),
        table(
            "Top idle holders, last hour",
            "The ten pods with the most idle GPU-hours in the last hour: held GPUs, MIG "
            "instances or shares they ran nothing on, or used under the idle threshold "
            "(the GPUHolderIdle alert fires after an hour of it)." + RULES,
            [
                target(f"topk(10, namespace_pod:gpu_idle_hours:increase1h{{{POD}}})"),
                target(f"namespace_pod:gpu_allocated_hours:increase1h{{{POD}}}"),
            ],
            "none",
            columns=[column("A", "Idle GPU-hours", "none"), column("B", "GPU-hours", "none")],
            hide=("cluster",),
            width=12,
        ),
        series(
            "GPU-hours by pod, per hour",
            "GPU-hours each pod held in the hour before each point." + HOURS + RULES,
            [target(f"namespace_pod:gpu_allocated_hours:increase1h{{{POD}}}", POD_LEGEND)],
            "none",
            stack=True,
        ),
    ]


def _unaccounted() -> list[Any]:
    return [
        Row("Unaccounted use"),
        series(
            "GPU memory held by no running container",
            "Per GPU or MIG instance, memory of processes that belong to no running container "
            "holding it; allocated=false: no pod holds the device (GPUMemoryUnaccounted, "
            "GPUUsedOutsidePods).",
            [
                target(
                    f"gpu_exporter_unaccounted_memory_bytes{{{CLUSTER}}}",
                    f"{DEVICE_LEGEND} allocated={{{{allocated}}}}",
                )
            ],
            "bytes",
        ),
        series(
            "Unallocated GPU-hours by node, per hour",
            "GPU-hours no pod held in the hour before each point: with the namespaces' "
            "GPU-hours, the node's total." + RULES,
            [target(f"node:gpu_unallocated_hours:increase1h{{{CLUSTER}}}", "{{node}}")],
            "none",
            stack=True,
        ),
        series(
            "Holes in the books by node, per hour",
            "GPU-hours charged to no pod in the hour before each point because the kubelet "
            "did not answer for longer than the exporter charges its last answer (attribution "
            "unknown; GPUAttributionUnknown), or because the exporter was not running (down, "
            "with --accounting-state-dir). 0 when there was none." + RULES,
            [
                target(
                    f"sum by (node) (node:gpu_attribution_unknown_hours:increase1h{{{CLUSTER}}})"
                    " or on() vector(0)",
                    "{{node}} attribution unknown",
                ),
                target(
                    f"sum by (node) (node:gpu_down_hours:increase1h{{{CLUSTER}}})"
                    " or on() vector(0)",
                    "{{node}} exporter down",
                ),
            ],
            "none",
            stack=True,
        ),
    ]


def build() -> dict[str, Any]:
    variables = [
        query_variable(
            "cluster", "Cluster", "label_values(namespace:gpu_allocated_hours:increase1h, cluster)"
        ),
        query_variable(
            "namespace",
            "Namespace",
            'label_values(namespace:gpu_allocated_hours:increase1h{cluster=~"$cluster"}, '
            "namespace)",
        ),
        query_variable(
            "pod",
            "Pod",
            "label_values(namespace_pod:gpu_allocated_hours:increase1h"
            '{cluster=~"$cluster", namespace=~"$namespace"}, pod)',
        ),
    ]
    return dashboard(
        "gpu-exporter-accounting",
        "GPU / Accounting",
        "Who used how many GPU-hours, how much of it sat idle, the energy and cost, and GPU "
        "memory no running pod accounts for. Needs the recording rules of "
        "alerts/gpu-accounting.rules.yaml; docs/accounting.md defines every number.",
        variables,
        [*_namespaces(), *_pods(), *_unaccounted()],
    )
