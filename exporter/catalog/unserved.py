"""DCGM fields this exporter knows but does not serve, each with the reason a user is told."""

from __future__ import annotations

# DCGM fields that are known but that NVML alone cannot serve, with the reason
# logged once at startup. Any other unknown name in a metrics file is an error.
UNSERVED: dict[str, str] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU licensing state exists only on vGPU guests; "
    "not available through NVML on bare-metal nodes",
    "DCGM_FI_DEV_COUNT": "node-level count; use gpu_exporter_gpus",
    "DCGM_FI_DEV_GPU_UTIL_SAMPLES": "DCGM's stream of nvmlDeviceGetProcessUtilization samples; "
    "not served (per-container utilization: gpu_exporter_container_sm_util_ratio)",
    "DCGM_FI_DEV_MEM_COPY_UTIL_SAMPLES": "DCGM's stream of nvmlDeviceGetProcessUtilization "
    "samples; not served",
    "DCGM_FI_DEV_FB_USED_PERCENT": "derive it: DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_NVSWITCH_LINK_STATUS": "NVSwitch fields need DCGM's NVSwitch module, "
    "not available through NVML",
    "DCGM_FI_DEV_DIAG_MEMORY_RESULT": "diagnostics results come from DCGM's diag, "
    "not available through NVML",
    "DCGM_FI_DEV_FABRIC_CLUSTER_UUID": "a string, usable only as a label, which this exporter "
    "reads once per GPU while the fabric sets it at registration; the fabric manager status and "
    "clique id are served",
}
