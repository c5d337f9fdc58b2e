"""The shape of the package, measured: import circles, what each stage may import, the top level.

    python3 -m tools.layout          # prints the measures; exits 1 when a rule is broken

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions, since
each is a dependency a reader has to follow. tests/test_layout.py asserts the same rules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "exporter"
GENERATED = PACKAGE / "workloads" / "kubelet" / "generated"  # protoc's output
MAX_TOP_LEVEL = 8  # exporter/'s own modules: the process and its three stages
# package prefix -> prefixes it must never import (the stages' one direction)
FORBIDDEN = {
    "exporter.exposition": ("exporter.workloads", "exporter.derive"),
    "exporter.workloads": ("exporter.exposition", "exporter.derive"),
    "exporter.nvml": ("exporter.exposition", "exporter.workloads", "exporter.derive"),
    "exporter.catalog": ("exporter.exposition", "exporter.workloads", "exporter.derive"),
    "exporter.config": ("exporter.exposition", "exporter.derive"),
    "exporter.derive": ("exporter.exposition", "exporter.http"),
}


def sources(package: Path = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every hand-written module below ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in modules else base)
    parents = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
    return (out & modules) - {name} - parents


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    src = sources(package)
    modules = set(src)
    return {name: imports(name, path, modules) for name, path in src.items()}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def forbidden(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that go against the stages' direction (FORBIDDEN)."""
    out = []
    for name, deps in sorted(g.items()):
        for prefix, banned in FORBIDDEN.items():
            if name == prefix or name.startswith(prefix + "."):
                out += [(name, d) for d in sorted(deps) if d.startswith(banned)]
    return out


def top_level(package: Path = PACKAGE) -> list[str]:
    """The modules directly in ``package``."""
    return sorted(p.stem for p in package.glob("*.py"))


def main() -> int:
    broken = 0
    for label, pkg in (("exporter", PACKAGE), ("benchmarks", ROOT / "benchmarks"),
                       ("tools", ROOT / "tools")):  # fmt: skip
        g = graph(pkg)
        c = cycle(g)
        edges = sum(len(v) for v in g.values())
        print(
            f"{label}: {len(g)} modules, {edges} imports, cycle: {' -> '.join(c) if c else 'none'}"
        )
        broken += c is not None
    bad = forbidden(graph())
    print(f"imports against the stages' direction: {len(bad)}")
    for a, b in bad:
        print(f"  {a} -> {b}")
    top = top_level()
    print(f"exporter/ top level: {len(top)} modules ({', '.join(top)}); at most {MAX_TOP_LEVEL}")
    broken += bool(bad) + (len(top) > MAX_TOP_LEVEL)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
