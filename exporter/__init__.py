"""GPU metrics exporter for Prometheus over NVML, with dcgm-exporter's metric names."""

__version__ = "0.1.0"
