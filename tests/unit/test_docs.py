"""Documentation that must stay true to the code."""

import re
from pathlib import Path

from exporter.cli import build_parser
from exporter.nvml.fields import FIELDS, UNSERVED

ROOT = Path(__file__).parents[2]


def test_compatibility_doc_lists_every_known_field():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    listed = set(re.findall(r"^\| (DCGM_\w+) \|", text, re.M))
    assert listed == set(FIELDS) | set(UNSERVED)


def test_readme_flag_table_covers_every_flag():
    text = (ROOT / "README.md").read_text()
    for action in build_parser()._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and long[0] not in ("--help", "--version"):
            assert f"`{long[0]}" in text or f", {long[0]}" in text, long[0]
