"""Documentation that must stay true to the code."""

import re
from pathlib import Path

from exporter.catalog.unserved import UNSERVED
from exporter.cli import build_parser
from exporter.nvml.fields import FIELDS

ROOT = Path(__file__).parents[2]


def test_compatibility_doc_lists_every_known_field():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    listed = set(re.findall(r"^\| (DCGM_\w+) \|", text, re.M))
    # DCGM 4.7 names: the third column of the renames table
    listed |= set(re.findall(r"^\| DCGM_\w+ \| [^|]+ \| (DCGM_\w+) \|", text, re.M))
    assert listed == set(FIELDS) | set(UNSERVED)


def test_readme_flag_table_covers_every_flag():
    text = (ROOT / "README.md").read_text()
    for action in build_parser()._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and long[0] not in ("--help", "--version"):
            assert f"`{long[0]}" in text or f", {long[0]}" in text, long[0]


def _flag_table() -> list[list[str]]:
    text = (ROOT / "docs" / "compatibility.md").read_text()
    section = text.split("## Flags and environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `--")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]


def test_compatibility_flag_table_matches_the_parser():
    """Every dcgm-exporter flag is in the table, with the short alias and variable the
    parser accepts, and a verdict; the parser accepts each one as the table writes it."""
    from exporter.config.dcgmflags import DCGM_FLAGS

    table = {row[0].strip("`"): row for row in _flag_table()}
    assert set(table) == {f"--{f.long}" for f in DCGM_FLAGS} | {"--version"}
    parser = build_parser()
    options = {o: a for a in parser._actions for o in a.option_strings}
    for f in DCGM_FLAGS:
        long, short, env, since, _, verdict = table[f"--{f.long}"]
        assert short == (f"`-{f.short}`" if f.short else ""), long
        assert env == f"`{f.env}`", long
        assert since.startswith(f.since.replace("PR 744", "after 4.8.4")), long
        assert options[f"--{f.long}"] is options.get(f"-{f.short}", options[f"--{f.long}"])
        assert verdict.startswith(("same", "different: ", "not applicable: ")), long
        assert verdict.startswith("not applicable") == f.dcgm_only, long
        args = [f"--{f.long}"] if f.boolean else [f"--{f.long}", "x"]
        assert getattr(parser.parse_args(args), f.dest) is not None
    assert table["--version"][1] == "`-v`" and "-v" in options


def test_security_doc_figures_are_the_codes():
    """The stop deadline, the kubelet message cap and the List deadline, as the code has
    them, in the sentences of docs/security.md that state them."""
    import inspect

    from exporter.http.server import STOP_DEADLINE_S
    from exporter.workloads.kubelet.podresources import PodResourcesClient
    from exporter.workloads.limits import MAX_MESSAGE_BYTES

    text = " ".join((ROOT / "docs" / "security.md").read_text().split())
    stop = re.search(r"SIGTERM stops within ([\d.]+) s", text)
    assert stop and float(stop.group(1)) == STOP_DEADLINE_S, stop
    cap = re.search(r"a (\d+) MiB message cap", text)
    assert cap and int(cap.group(1)) * 1024 * 1024 == MAX_MESSAGE_BYTES, cap
    deadline = re.search(r"only `List` is called, with a ([\d.]+) s deadline", text)
    timeout = inspect.signature(PodResourcesClient).parameters["timeout_s"].default
    assert deadline and float(deadline.group(1)) == timeout, deadline


def test_compatibility_doc_units_are_the_help_texts():
    """Each throughput's unit in the units line and in the field table is the one the
    shipped metrics file's HELP gives it."""
    from exporter.config.model import default_metrics_file

    text = (ROOT / "docs" / "compatibility.md").read_text()
    units_line = " ".join(text.split("- Units:", 1)[1].split("\n- ", 1)[0].split())
    helps = {}
    extended = Path(default_metrics_file()).with_name("metrics-extended.csv")
    for line in extended.read_text().splitlines():
        if line.startswith("DCGM_"):
            name, _, help_text = (c.strip() for c in line.split(",", 2))
            helps[name] = help_text
    cases = {
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("KB/s", "in KB/s"),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("1000 KiB/s", "in 1000 KiB/s"),
    }
    for name, (unit, said) in cases.items():
        assert said in helps[name], (name, helps[name])
        row = re.search(rf"^\| {name} \| \w+ \| ([^|]+) \|", text, re.M)
        assert row and row.group(1).strip() == unit, (name, row)
        assert re.search(rf"{re.escape(unit)}[^;]*`{name}`", units_line), (name, units_line)
    assert "bytes/s for PCIe/NVLink" not in units_line
