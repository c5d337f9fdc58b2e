"""Generate the Grafana dashboards in dashboards/*.json from the modules beside this file.

Every query on the exporter's own series (DCGM_*, gpu_exporter_*, up) reads the scrape
job of alerts/config.yaml only, as the rules do (the recording rules' series already
are), so a second exporter of the same names does not double a panel. The modules write
dcgm-exporter 4.8's names and units; each query of a field that dcgm-exporter 4.9 renames
reads either name (alerts/generate.py's any_release), so the dashboards work whichever
release the exporters mimic.

python dashboards/generate.py            # rewrite the JSON files
python dashboards/generate.py --check    # exit 1 if a JSON file is out of date
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import accounting
import fleet
import health
import workloads

DASHBOARDS_DIR = Path(__file__).resolve().parent
BUILDERS = {
    "gpu-fleet.json": fleet.build,
    "gpu-workloads.json": workloads.build,
    "gpu-health.json": health.build,
    "gpu-accounting.json": accounting.build,
}


def _alerts_generate() -> Any:
    path = DASHBOARDS_DIR.parent / "alerts" / "generate.py"
    spec = importlib.util.spec_from_file_location("alerts_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def select_job(node: Any, job: str, select: Any) -> Any:
    """``node`` with every PromQL string (targets' expr, variables' query) job-selected."""
    if isinstance(node, dict):
        return {
            k: select(v, job)
            if k in ("expr", "query", "definition") and isinstance(v, str)
            else select_job(v, job, select)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [select_job(v, job, select) for v in node]
    return node


def render(build: Any) -> str:
    gen = _alerts_generate()

    def select(expr: str, job: str) -> str:
        return gen.any_release(gen.select_job(expr, job))

    dashboard = select_job(build(), gen.load_config()["job"], select)
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, build in BUILDERS.items():
        path = DASHBOARDS_DIR / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    for name in stale:
        print(
            f"dashboards/{name} is out of date: run `python dashboards/generate.py`",
            file=sys.stderr,
        )
    if stale:
        return 1
    return 0 if args.check else _refresh_deploy_copies()


def _refresh_deploy_copies() -> int:
    """deploy/ carries copies of the generated files (kustomize cannot reach outside)."""
    import subprocess

    deploy = Path(__file__).resolve().parents[1] / "deploy" / "generate.py"
    return subprocess.run([sys.executable, str(deploy)], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
