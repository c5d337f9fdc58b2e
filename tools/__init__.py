"""Tools for developers and operators that are neither the exporter nor its benchmarks."""
