"""Which dcgm-exporter release a node mimics (``--dcgm-exporter-version``), and what that picks.

One setting decides what differs between dcgm-exporter releases beyond the metrics
file's own rows: the node label's name (``Hostname`` until 4.8.2, ``hostname`` since
4.8.3), the ``GPU_CI_ID`` label on MIG series (4.8.4), the severity and category labels
of DCGM_EXP_GPU_HEALTH_STATUS (4.8.3), the startup rules 4.8.3 added (``--enable-pprof``
needs ``--web-config-file``, ``--dcgm-log-level`` must be one of DCGM's), the DCGM release
whose XID health grading it ships (DCGM 4.5.3 in 4.8.2, 4.6 later), and the metrics
file shipped for the release (metric names, units and Prometheus types as that release's
CSV has them; 4.9 has DCGM 4.7's names, 4.10 also its four ``_BYTES_PER_SECOND`` names). A
metrics file with any generation's names is served as it is written under every setting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Release:
    """What mimicking one dcgm-exporter release changes."""

    name: str  # as given to --dcgm-exporter-version
    hostname_label: str  # name of the node label (its value is NODE_NAME)
    ci_label: bool  # GPU_CI_ID beside GPU_I_ID on MIG series
    health_detail: bool  # health_error_severity and health_error_category on the health status
    metrics_file: str  # the shipped metrics file, in the package (exporter/)
    strict_flags: bool = True  # 4.8.3's startup errors (pprof without web config, log level)
    dcgm: str = "4.6.0"  # the DCGM release whose XID health grading it mimics
    # its DCGM is 4.7 or newer: a name that DCGM 4.6 defines as an alias and 4.7 as a field of
    # its own (DCGM_FI_DEV_GPU_UTIL_RATIO: 0-100 in 4.6, 0-1 in 4.7) reads the 4.7 field
    dcgm47: bool = False


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release(
            "4.8.2", "Hostname", False, False, "metrics-4.8.2.csv", strict_flags=False, dcgm="4.5.3"
        ),
        Release("4.8.4", "hostname", True, True, "metrics.csv"),
        Release("4.9", "hostname", True, True, "metrics-4.9.csv", dcgm47=True),
        Release("4.10", "hostname", True, True, "metrics-4.10.csv", dcgm47=True),
    )
}
ALIASES = {"4.9.0": "4.9", "4.10.0": "4.10"}
DEFAULT = RELEASES["4.8.4"]
"""The newest release whose metric names and units are all confirmed: 4.9.0's release notes
leave part of its renames to secondary sources (exporter/catalog/dcgm-names.csv marks them)."""


def parse_release(value: str) -> Release | None:
    """The release named ``value`` (``4.8.2``, ``4.8.4``, ``4.9``, ``4.10``, or ``4.9.0``,
    ``4.10.0``), else None."""
    v = value.strip()
    return RELEASES.get(ALIASES.get(v, v))
