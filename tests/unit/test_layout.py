"""The shape of the package: small modules, and imports that never go round in a circle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "exporter"
GENERATED = PACKAGE / "workloads" / "kubelet" / "generated"  # protoc's output, not written by hand
MAX_LINES = 400


def _sources() -> dict[str, Path]:
    """Module name -> file, for every hand-written module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run when the module is imported: not in functions or under TYPE_CHECKING."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _load_time(node.body)
            yield from _load_time(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _load_time(block)
            for handler in node.handlers:
                yield from _load_time(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _load_time(node.body)


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``name`` imports at load time."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _load_time(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in modules else base)
    return (out & modules) - {name}


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {name: _imports(name, path, modules) for name, path in sources.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_over_400_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _sources().values()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_checks_see_the_package():
    """The graph holds the modules and edges the two tests above rely on."""
    graph = _graph()
    assert len(graph) > 50 and "exporter.nvml.session" in graph
    assert "exporter.nvml.session" in graph["exporter.nvml.devices"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _serves_http(path: Path) -> bool:
    """Whether a module imports aiohttp's server side (aiohttp.web, its HTTP parser)."""
    for node in _load_time(ast.parse(path.read_text(), str(path)).body):
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
    (app) and the reload state hung on it (signals) touch aiohttp's server side, and the
    package's top level keeps the process's own modules."""
    outside = {
        name
        for name, path in _sources().items()
        if not name.startswith("exporter.http") and _serves_http(path)
    }
    assert outside <= {"exporter.app", "exporter.runtime.signals"}, outside
    top = {p.stem for p in PACKAGE.glob("*.py")}
    http_words = {"server", "connections", "listener", "eviction", "headers", "tlsstart",
                  "httplog", "fastpath", "routes", "accesslog"}  # fmt: skip
    assert not top & http_words, top & http_words
    assert not (PACKAGE / "webconfig").exists()


def _every_import(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, wherever: at load time, under TYPE_CHECKING or in a
    function (absolute names; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


# package -> the packages none of its modules may import, in any form
FORBIDDEN = {
    # rendering turns frames into bytes: it reads no workload source and no derived state
    "exporter.exposition": ("exporter.workloads", "exporter.derive"),
    # workload sources hand over records (exporter/frame.py), never text
    "exporter.workloads": ("exporter.exposition",),
}


def _violations() -> list[str]:
    found = []
    for name, path in _sources().items():
        for package, banned in FORBIDDEN.items():
            if name != package and not name.startswith(package + "."):
                continue
            for imported in sorted(_every_import(name, path)):
                if imported.startswith(tuple(f"{b}." for b in banned)) or imported in banned:
                    found.append(f"{name} imports {imported}")
    return found


def test_stages_import_in_one_direction():
    """collect -> derive -> render: exposition imports nothing from workloads/ or derive/,
    and workloads/ nothing from exposition/, TYPE_CHECKING and function-level imports
    included; what crosses is in exporter/frame.py."""
    assert _violations() == []


def test_the_direction_check_sees_every_kind_of_import(tmp_path: Path):
    """The check finds an import under TYPE_CHECKING, in a function and a relative one."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from exporter.workloads.mapper import PodMap\n"
        "def f():\n    import exporter.derive.stage\n"
        "from ..derive import xids\n"
    )
    got = _every_import("exporter.exposition.m", src)
    assert {"exporter.workloads.mapper.PodMap", "exporter.derive.stage"} <= got
    assert "exporter.derive.xids" in got
