"""GPU health: XIDs, ECC, row remapping, throttling, temperatures, PCIe and NVLink errors."""

from __future__ import annotations

from typing import Any

from grafana import (
    GPU_SELECTOR,
    HOST,
    NODE_SELECTOR,
    Row,
    column,
    dashboard,
    dashed,
    gpu_variables,
    stat,
    state_timeline,
    table,
    target,
    timeseries,
)

N = NODE_SELECTOR
G = GPU_SELECTOR
GPU_LEGEND = f"{HOST} GPU {{{{gpu}}}}"
BY_GPU = "Hostname, hostname, gpu"
BY_GPU_UUID = "Hostname, hostname, gpu, UUID"
ALERTS = f'ALERTS{{alertname=~"GPU.+", alertstate="firing", {N}}}'


def _per_gpu(expr: str) -> str:
    """One series per physical GPU: device series may carry changing pod labels."""
    return f"max by ({BY_GPU_UUID}) ({expr})"


def _mask_bit(shift: int, width: int, test: str) -> str:
    """1 where a condition of the fabric health mask holds (nvml.h's bit fields), else 0."""
    field = f"floor(DCGM_FI_DEV_FABRIC_HEALTH_MASK{{{G}}} / {2**shift}) % {width}"
    return _per_gpu(f"{field} {test.replace(' ', ' bool ', 1)}")


def build() -> dict[str, Any]:
    items = [
        Row("Alerts and availability"),
        stat(
            "Firing GPU alerts",
            "GPU alerts (alerts/gpu-alerts.rules.yaml) firing now for the selected nodes.",
            f"count({ALERTS}) or vector(0)",
            "none",
            width=8,
        ),
        stat(
            "GPUs not responding",
            "GPUs the exporter saw earlier that stopped answering (fallen off the bus).",
            f"count(gpu_exporter_gpu_up{{{G}}} == 0) or vector(0)",
            "none",
            width=8,
        ),
        stat(
            "Oldest collection",
            "Age of the oldest last successful collection among the selected exporters; "
            "more than three collection intervals means stale values.",
            f"max(time() - gpu_exporter_last_collection_success_timestamp_seconds{{{N}}})",
            "s",
            width=8,
        ),
        table(
            "Firing alerts by GPU",
            "Every firing GPU alert with its node, GPU and workload.",
            [target(ALERTS)],
            "none",
            hide=("__name__", "alertstate", "job", "instance", "cluster", "Value"),
            width=12,
        ),
        state_timeline(
            "GPU answering",
            "Whether each GPU the exporter knows answers NVML queries.",
            [target(f"gpu_exporter_gpu_up{{{G}}}", GPU_LEGEND)],
            {"1": ("up", "green"), "0": ("not responding", "red")},
        ),
        timeseries(
            "GPUs per node",
            "Physical GPUs each node's exporter reports; a drop means a GPU was lost.",
            [target(f"gpu_exporter_gpus{{{N}}}", "{{node}}")],
            "none",
        ),
        state_timeline(
            "Collector success",
            "Whether each collector of each exporter succeeded in its last run.",
            [target(f"gpu_exporter_collector_success{{{N}}}", "{{node}} {{collector}}")],
            {"1": ("ok", "green"), "0": ("failing", "red")},
        ),
        Row("XID errors"),
        timeseries(
            "XID events",
            "XID events per GPU and code, from the exporter's XID counter.",
            [
                target(
                    f"sum by ({BY_GPU}, xid) "
                    f"(increase(DCGM_EXP_XID_ERRORS_TOTAL{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} XID {{{{xid}}}}",
                )
            ],
            "none",
            bars=True,
        ),
        table(
            "Last XID reported per GPU",
            "The last XID each GPU reported (DCGM_FI_DEV_XID_ERRORS keeps it until the "
            "exporter restarts: history, not a current fault).",
            [target(f"max by ({BY_GPU_UUID}, err_code, err_msg) (DCGM_FI_DEV_XID_ERRORS{{{G}}})")],
            "none",
            columns=[column("A", "XID", "none")],
            width=12,
        ),
        table(
            "XIDs in the time range",
            "XID events per GPU and code over the dashboard's time range. See "
            "docs/alerts.md for what each code means.",
            [
                target(
                    f"sum by ({BY_GPU_UUID}, xid) "
                    f"(increase(DCGM_EXP_XID_ERRORS_TOTAL{{{G}}}[$__range]))"
                )
            ],
            "none",
            columns=[column("A", "Events", "none")],
        ),
        Row("Memory"),
        timeseries(
            "ECC errors",
            "Single-bit (corrected) and double-bit (uncorrectable) ECC errors per GPU, per "
            "rate interval, from the volatile counters.",
            [
                target(
                    f"max by ({BY_GPU}) "
                    f"(increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} single-bit",
                ),
                target(
                    f"max by ({BY_GPU}) "
                    f"(increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} double-bit",
                ),
            ],
            "none",
            bars=True,
        ),
        timeseries(
            "Remapped rows",
            "Memory rows each GPU has remapped to spares over its life, after correctable "
            "and after uncorrectable errors (Ampere and newer).",
            [
                target(
                    _per_gpu(f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{G}}}"),
                    f"{GPU_LEGEND} correctable",
                ),
                target(
                    _per_gpu(f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{G}}}"),
                    f"{GPU_LEGEND} uncorrectable",
                ),
            ],
            "none",
        ),
        table(
            "Memory repair state",
            "Per GPU: rows remapped, a remap waiting for a reset, a remap failure (replace the "
            "GPU), and on pre-Ampere GPUs retired pages and retirement pending.",
            [
                target(_per_gpu(f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_RETIRED_SBE{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_RETIRED_DBE{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_RETIRED_PENDING{{{G}}}")),
            ],
            "none",
            columns=[
                column("A", "Rows remapped (correctable)", "none"),
                column("B", "Rows remapped (uncorrectable)", "none"),
                column("C", "Remap pending", "bool_yes_no"),
                column("D", "Remap failure", "bool_yes_no"),
                column("E", "Retired pages (single-bit)", "none"),
                column("F", "Retired pages (double-bit)", "none"),
                column("G", "Retirement pending", "bool_yes_no"),
            ],
        ),
        Row("Thermal and power"),
        timeseries(
            "Temperature against limits",
            "GPU and memory temperature, with each GPU's own slowdown and shutdown "
            "temperatures dashed.",
            [
                target(_per_gpu(f"DCGM_FI_DEV_GPU_TEMP{{{G}}}"), GPU_LEGEND),
                target(_per_gpu(f"DCGM_FI_DEV_MEMORY_TEMP{{{G}}}"), f"{GPU_LEGEND} memory"),
                target(_per_gpu(f"DCGM_FI_DEV_SLOWDOWN_TEMP{{{G}}}"), f"{GPU_LEGEND} slowdown"),
                target(_per_gpu(f"DCGM_FI_DEV_SHUTDOWN_TEMP{{{G}}}"), f"{GPU_LEGEND} shutdown"),
            ],
            "celsius",
            minimum=None,
            overrides=[dashed(" (slowdown|shutdown)$")],
        ),
        timeseries(
            "Throttling",
            "Share of time each GPU's clocks were held back, by cause, from the violation "
            "counters (nanoseconds throttled).",
            [
                target(
                    f"max by ({BY_GPU}) "
                    f"(rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{G}}}[$__rate_interval])) / 1e9",
                    f"{GPU_LEGEND} thermal",
                ),
                target(
                    f"max by ({BY_GPU}) "
                    f"(rate(DCGM_FI_DEV_POWER_VIOLATION{{{G}}}[$__rate_interval])) / 1e9",
                    f"{GPU_LEGEND} power",
                ),
                target(
                    f"max by ({BY_GPU}) "
                    f"(rate(DCGM_FI_DEV_BOARD_LIMIT_VIOLATION{{{G}}}[$__rate_interval])) / 1e9",
                    f"{GPU_LEGEND} board limit",
                ),
                target(
                    f"max by ({BY_GPU}) "
                    f"(rate(DCGM_FI_DEV_RELIABILITY_VIOLATION{{{G}}}[$__rate_interval])) / 1e9",
                    f"{GPU_LEGEND} reliability",
                ),
            ],
            "percentunit",
            maximum=1,
        ),
        timeseries(
            "Power against the enforced limit",
            "Power draw of each GPU as a share of its enforced power limit.",
            [
                target(
                    f"max by ({BY_GPU}) (DCGM_FI_DEV_POWER_USAGE{{{G}}})"
                    f" / max by ({BY_GPU}) (DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{G}}} > 0)",
                    GPU_LEGEND,
                )
            ],
            "percentunit",
            width=24,
        ),
        Row("PCIe and NVLink"),
        timeseries(
            "PCIe replays",
            "PCIe packets each GPU's link had to resend, per minute. More than 8 per minute "
            "is DCGM's warning level.",
            [
                target(
                    f"max by ({BY_GPU}) "
                    f"(rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{G}}}[$__rate_interval])) * 60",
                    GPU_LEGEND,
                )
            ],
            "cpm",
        ),
        timeseries(
            "NVLink errors",
            "NVLink CRC (flit and data), replay and recovery errors per second per GPU. CRC "
            "errors matter from 100/s; any replay or recovery error counts. Blackwell's "
            "NVLink5 counts effective errors and link recovery events instead (the CRC and "
            "replay series are blank there, as in DCGM).",
            [
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} CRC flit",
                ),
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} CRC data",
                ),
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} replay",
                ),
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} recovery",
                ),
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} effective (NVLink5)",
                ),
                target(
                    f"max by ({BY_GPU}) (rate(DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS"
                    f"{{{G}}}[$__rate_interval]))",
                    f"{GPU_LEGEND} link recovery (NVLink5)",
                ),
            ],
            "cps",
        ),
        table(
            "PCIe link",
            "Current PCIe generation and width of each GPU's link; a link below its "
            "siblings' generation or width points at a seating or riser fault.",
            [
                target(_per_gpu(f"DCGM_FI_DEV_PCIE_LINK_GEN{{{G}}}")),
                target(_per_gpu(f"DCGM_FI_DEV_PCIE_LINK_WIDTH{{{G}}}")),
            ],
            "none",
            columns=[column("A", "Generation", "none"), column("B", "Width", "none")],
        ),
        Row("NVLink fabric"),
        state_timeline(
            "Fabric registration",
            "Each GPU's registration with the NVLink fabric of NVSwitch and NVL systems "
            "(DCGM_FI_DEV_FABRIC_MANAGER_STATUS). Needs the fabric rows of the metrics file; "
            "GPUs without a fabric have no row.",
            [target(_per_gpu(f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{{{G}}}"), GPU_LEGEND)],
            {
                "0": ("no fabric", "text"),
                "1": ("not started", "red"),
                "2": ("in progress", "orange"),
                "3": ("registered", "green"),
                "4": ("failed", "red"),
                "5": ("unrecognized", "red"),
                "6": ("NVML too old", "text"),
            },
        ),
        state_timeline(
            "Fabric health",
            "NVML's summary of each GPU's fabric health (DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY, "
            "drivers from R580).",
            [target(_per_gpu(f"DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY{{{G}}}"), GPU_LEGEND)],
            {
                "0": ("not reported", "text"),
                "1": ("healthy", "green"),
                "2": ("unhealthy", "red"),
                "3": ("limited capacity", "orange"),
            },
        ),
        table(
            "Fabric by GPU",
            "Per GPU: the fabric clique it belongs to and the conditions set in NVML's fabric "
            "health mask (DCGM_FI_DEV_FABRIC_HEALTH_MASK) that DCGM's health watch fails on.",
            [
                target(_per_gpu(f"DCGM_FI_DEV_FABRIC_CLIQUE_ID{{{G}}}")),
                target(_mask_bit(0, 4, "== 1")),
                target(_mask_bit(2, 4, "== 1")),
                target(_mask_bit(4, 4, "== 1")),
                target(_mask_bit(6, 4, "== 1")),
                target(_mask_bit(8, 16, "> 1")),
            ],
            "none",
            columns=[
                column("A", "Clique", "none"),
                column("B", "Degraded bandwidth", "bool_yes_no"),
                column("C", "Route recovery", "bool_yes_no"),
                column("D", "Route unhealthy", "bool_yes_no"),
                column("E", "Access timeout recovery", "bool_yes_no"),
                column("F", "Wrong configuration", "bool_yes_no"),
            ],
        ),
        Row("Exporter"),
        timeseries(
            "Collection duration",
            "Time each exporter's collection cycle takes; it must stay well under the "
            "collection interval.",
            [target(f"gpu_exporter_collection_duration_seconds{{{N}}}", "{{node}}")],
            "s",
        ),
        timeseries(
            "NVML errors",
            "NVML calls failing per second, by function and error code. NOT_SUPPORTED is left "
            "out: it only says a GPU lacks that reading.",
            [
                target(
                    "sum by (node, function, code) (rate(gpu_exporter_nvml_errors_total"
                    f'{{{N}, code!="NOT_SUPPORTED"}}[$__rate_interval]))',
                    "{{node}} {{function}} {{code}}",
                )
            ],
            "cps",
        ),
    ]
    return dashboard(
        "gpu-exporter-health",
        "GPU / Health",
        "GPU hardware health: XIDs, ECC and memory repair, throttling and temperatures "
        "against the GPUs' own limits, PCIe and NVLink errors, and the exporter itself. "
        "Each GPU shows once: the per-instance copies of a MIG GPU's device-level fields "
        "are taken with max, never summed.",
        gpu_variables(),
        items,
    )
