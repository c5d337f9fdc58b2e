"""Metrics files for tests: the shipped default, and every row with a series of its own.

The default serves only what dcgm-exporter's default and the bundled alerts and dashboards
read (docs/compatibility.md); tests of a family it leaves out read ``ALL_ROWS``: the
extended file's rows without the label rows the default leaves out, which would change
every series' labels. Its DCGM 4.7 names read as dcgm-exporter 4.9 serves them
(``GPU_UTIL_RATIO`` 0-1; tests/config/test_releases.py checks DCGM 4.6's meaning).
"""

from __future__ import annotations

import re
from pathlib import Path

from exporter.catalog.metricsfile import Catalog, parse
from exporter.config.model import default_metrics_file

EXTENDED = Path(default_metrics_file()).with_name("metrics-extended.csv")
ALL_ROWS_TEXT = re.sub(
    r"^(?!DCGM_FI_DRIVER_VERSION,)DCGM_\w+,\s*label,.*\n", "", EXTENDED.read_text(), flags=re.M
)
ALL_ROWS: Catalog = parse(ALL_ROWS_TEXT, "all-rows.csv", dcgm47=True)
