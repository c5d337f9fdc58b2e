"""XID codes and the short description exported as ``err_msg`` on DCGM_FI_DEV_XID_ERRORS.

Descriptions summarise NVIDIA's XID catalog in our words; codes not listed
export ``err_msg="Unknown XID"`` and keep their code in ``err_code``.
"""

DESCRIPTIONS: dict[int, str] = {
    0: "No Error",
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    46: "GPU timeout; reset required",
    48: "Double-bit ECC error",
    61: "Internal micro-controller breakpoint or warning",
    62: "Internal micro-controller halt",
    63: "Row remapping event (ECC page retirement or row remap)",
    64: "Row remapping failure",
    68: "Video processor exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link corrected error",
    140: "Unrecovered ECC error",
    143: "GPU initialization failure",
    144: "NVLink SAW error",
    145: "NVLink RLW error",
    146: "NVLink TLW error",
    147: "NVLink TREX error",
    148: "NVLink NVLE error",
    149: "NVLink NETIR error",
    150: "NVLink MSE error",
}


def describe(xid: int) -> str:
    """The err_msg for an XID code."""
    return DESCRIPTIONS.get(xid, "Unknown XID")
