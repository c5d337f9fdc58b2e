"""GPU metrics exporter for Prometheus over NVML, with dcgm-exporter's metric names."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path


def _version() -> str:
    """pyproject.toml's project.version: read from the source tree when running from one (an
    editable install's metadata lags a bump until it is reinstalled), else the installed
    package's metadata."""
    source = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(source.read_text())["project"]
        if project.get("name") == "gpu-exporter":
            return str(project["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return metadata.version("gpu-exporter")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()
