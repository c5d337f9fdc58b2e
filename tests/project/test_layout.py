"""The shape of the package: small modules, stages that import in one direction, no circles.

The rules and the import graph are tools/layout.py's (``python3 -m tools.layout`` prints
the same measures); every import counts, ``TYPE_CHECKING`` and function-level ones too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tools import layout

ROOT = layout.ROOT
PACKAGE = layout.PACKAGE
MAX_LINES = 400
TOP_LEVEL = {"__init__", "__main__", "app", "cli", "collector", "poller", "snapshot", "frame"}


def test_no_module_over_400_lines():
    lines = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in layout.sources().values()
    }
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_no_import_cycles_with_every_import_counted():
    for package in (PACKAGE, ROOT / "benchmarks", ROOT / "tools"):
        cycle = layout.cycle(layout.graph(package))
        assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_stages_import_in_one_direction():
    """exposition renders frames (no workload source, no derive state); workloads hand plain
    records over (no exposition); nvml and the catalogue know neither."""
    assert layout.forbidden(layout.graph()) == []


def test_the_top_level_holds_the_process_only():
    top = set(layout.top_level())
    assert top <= TOP_LEVEL and len(top) <= layout.MAX_TOP_LEVEL, sorted(top - TOP_LEVEL)


def test_the_checks_see_the_package():
    """The graph holds every kind of import the rules rely on; the cycle finder finds one."""
    g = layout.graph()
    assert len(g) > 100 and "exporter.nvml.session" in g["exporter.nvml.devices"]
    # a function-level import (the simulator is loaded only with --simulate)
    assert "exporter.sim" in g["exporter.cli"]
    assert layout.cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert layout.cycle({"a": {"b"}, "b": set()}) is None
    assert layout.forbidden({"exporter.exposition.x": {"exporter.derive.y"}}) == [
        ("exporter.exposition.x", "exporter.derive.y")
    ]


def test_every_kind_of_import_counts(tmp_path: Path):
    """An import under TYPE_CHECKING, one in a function and a relative one are edges."""
    pkg = tmp_path / "exporter"
    (pkg / "exposition").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "exposition" / "__init__.py"):
        init.write_text("")
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from exporter import b\n"
    (pkg / "a.py").write_text(a)
    (pkg / "b.py").write_text("def f():\n    from exporter.a import x\n")
    (pkg / "exposition" / "c.py").write_text("from ..b import f\n")
    g = layout.graph(pkg)
    assert layout.cycle(g) == ["exporter.a", "exporter.b", "exporter.a"]
    assert g["exporter.exposition.c"] == {"exporter.b"}


def _serves_http(path: Path) -> bool:
    """Whether a module imports aiohttp's server side (aiohttp.web, its HTTP parser)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        if any(n.startswith(("aiohttp.web", "aiohttp.http")) for n in names):
            return True
    return False


def test_http_lives_in_its_package():
    """What serves HTTP is in exporter.http; of the rest only the application's builder
    (app) and the reload state hung on it (runtime.signals) touch aiohttp's server side."""
    outside = {
        name
        for name, path in layout.sources().items()
        if not name.startswith("exporter.http") and _serves_http(path)
    }
    assert outside <= {"exporter.app", "exporter.runtime.signals"}, outside
