"""One linter and formatter, configured in pyproject.toml, over the whole tree."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args):
    ruff = shutil.which("ruff") or pytest.skip("ruff not installed: pip install -e '.[test]'")
    p = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy():
    """The type checker, configured in pyproject.toml ([tool.mypy]), finds nothing in exporter/."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy not installed: pip install -e '.[test]'")
    p = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-2000:]


def test_package_imports_without_kubernetes_or_grpc():
    code = (
        "import sys, exporter.app, exporter.cli; "
        "print(sorted(m for m in ('kubernetes', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
