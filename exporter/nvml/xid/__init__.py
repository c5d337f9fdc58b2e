"""XID errors from the driver: NVML events and the kernel log, each read in a thread of its own."""
