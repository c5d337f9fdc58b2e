"""Small builders for Grafana dashboard JSON (classic model, schemaVersion 41).

Every panel and variable queries the `${datasource}` variable, whose default is Grafana's
default Prometheus data source: the same JSON works imported in the UI and provisioned from
a file or by the dashboard sidecar, which substitute no `${DS_...}` placeholder.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 41
GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
HOST = "{{Hostname}}{{hostname}}"
"""Legend text for the node: the exporter's host label in either spelling."""

Panel = dict[str, Any]


class Row:
    """A full-width row header in a layout. A collapsed row holds the panels after it (up to
    the next row), and Grafana runs their queries only when someone opens it."""

    def __init__(self, title: str, *, collapsed: bool = False) -> None:
        self.title = title
        self.collapsed = collapsed


def target(expr: str, legend: str = "", *, instant: bool = False) -> dict[str, Any]:
    """A Prometheus query; instant queries return one value per series (tables, bars)."""
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
    }


def _panel(
    kind: str,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    width: int,
    height: int,
    options: dict[str, Any],
    custom: dict[str, Any] | None = None,
    overrides: list[dict[str, Any]] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    mappings: list[dict[str, Any]] | None = None,
    transformations: list[dict[str, Any]] | None = None,
) -> Panel:
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic"}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if custom:
        defaults["custom"] = custom
    if mappings:
        defaults["mappings"] = mappings
    panel: Panel = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"w": width, "h": height},
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options,
        "targets": [
            {**query, "refId": chr(ord("A") + index)} for index, query in enumerate(targets)
        ],
    }
    if transformations:
        panel["transformations"] = transformations
    return panel


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
    stack: bool = False,
    bars: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> Panel:
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else (25 if stack else 10),
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    options = {
        "legend": {
            "displayMode": "table",
            "placement": "bottom",
            "showLegend": True,
            "calcs": ["mean", "max", "lastNotNull"],
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return _panel(
        "timeseries",
        title,
        description,
        targets,
        unit,
        width=width,
        height=height,
        options=options,
        custom=custom,
        overrides=overrides,
        minimum=minimum,
        maximum=maximum,
    )


def stat(
    title: str,
    description: str,
    expr: str,
    unit: str,
    *,
    width: int = 3,
    height: int = 4,
) -> Panel:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": "auto",
    }
    return _panel(
        "stat",
        title,
        description,
        [target(expr)],
        unit,
        width=width,
        height=height,
        options=options,
    )


def column(ref: str, name: str, unit: str) -> dict[str, Any]:
    """A table override naming the value column of query `ref` and giving its unit."""
    return {
        "matcher": {"id": "byName", "options": f"Value #{ref}"},
        "properties": [{"id": "displayName", "value": name}, {"id": "unit", "value": unit}],
    }


def table(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    columns: list[dict[str, Any]] | None = None,
    hide: tuple[str, ...] = (),
    width: int = 24,
    height: int = 8,
) -> Panel:
    """A table of instant queries merged on their labels; `hide` drops label columns."""
    transformations = [
        {"id": "merge", "options": {}},
        {
            "id": "organize",
            "options": {"excludeByName": {"Time": True, **dict.fromkeys(hide, True)}},
        },
    ]
    options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    custom = {"align": "auto", "cellOptions": {"type": "auto"}, "filterable": True}
    targets = [{**query, "format": "table", "instant": True, "range": False} for query in targets]
    return _panel(
        "table",
        title,
        description,
        targets,
        unit,
        width=width,
        height=height,
        options=options,
        custom=custom,
        overrides=columns,
        transformations=transformations,
    )


def state_timeline(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    mappings: dict[str, tuple[str, str]],
    *,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """States of a 0/1 gauge; `mappings` maps each value to (text, colour)."""
    value_mappings = [
        {
            "type": "value",
            "options": {
                value: {"text": text, "color": colour, "index": index}
                for index, (value, (text, colour)) in enumerate(mappings.items())
            },
        }
    ]
    options = {
        "mergeValues": True,
        "showValue": "never",
        "alignValue": "left",
        "rowHeight": 0.9,
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    panel = _panel(
        "state-timeline",
        title,
        description,
        targets,
        "none",
        width=width,
        height=height,
        options=options,
        mappings=value_mappings,
    )
    panel["fieldConfig"]["defaults"]["color"] = {"mode": "thresholds"}
    return panel


def bargauge(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
) -> Panel:
    options = {
        "orientation": "horizontal",
        "displayMode": "gradient",
        "valueMode": "color",
        "showUnfilled": True,
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    }
    return _panel(
        "bargauge", title, description, targets, unit, width=width, height=height, options=options
    )


def dashed(regex: str) -> dict[str, Any]:
    """An override drawing the series whose name matches `regex` as dashed lines."""
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


def layout(items: list[Panel | Row]) -> list[Panel]:
    """Give each panel an id and a grid position, left to right, wrapping at full width."""
    panels: list[Panel] = []
    into = panels  # a collapsed row's panels go into the row
    x = y = line_height = 0
    for panel_id, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y += line_height
            x, line_height = 0, 0
            row: Panel = {
                "type": "row",
                "id": panel_id,
                "title": item.title,
                "collapsed": item.collapsed,
                "gridPos": {"x": 0, "y": y, "w": GRID_WIDTH, "h": 1},
                "panels": [],
            }
            panels.append(row)
            into = row["panels"] if item.collapsed else panels
            y += 1
            continue
        width, height = item["gridPos"]["w"], item["gridPos"]["h"]
        if x + width > GRID_WIDTH:
            y += line_height
            x, line_height = 0, 0
        into.append({"id": panel_id, **item, "gridPos": {"x": x, "y": y, "w": width, "h": height}})
        x += width
        line_height = max(line_height, height)
    return panels


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        # No current value: Grafana selects the default Prometheus data source, imported in
        # the UI and provisioned (the sidecar substitutes no ${DS_...} placeholder) alike.
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(name: str, label: str, query: str, *, numeric: bool = False) -> dict[str, Any]:
    """A multi-value label variable with an All option matching anything, even no label."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 3 if numeric else 1,
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    items: list[Panel | Row],
) -> dict[str, Any]:
    panels = layout(items)
    nested = [p for panel in panels for p in panel.get("panels", [])]
    kinds = sorted({panel["type"] for panel in panels + nested if panel["type"] != "row"})
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": kind, "version": ""} for kind in kinds),
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "title": "GPU dashboards",
                "type": "dashboards",
                "tags": ["gpu-exporter"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "panels": panels,
        "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["gpu-exporter", "gpu", "nvidia"],
        "templating": {"list": [datasource_variable(), *variables]},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# Selectors and variables shared by the GPU dashboards.
NODE_SELECTOR = 'cluster=~"$cluster", node=~"$node"'
GPU_SELECTOR = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'


def gpu_variables(nodes: str = "DCGM_FI_DEV_GPU_TEMP") -> list[dict[str, Any]]:
    """cluster, node and gpu, each narrowing the next; cluster and node from the series
    ``nodes`` (a recorded per-node series keeps a fleet view off per-device series)."""
    return [
        query_variable("cluster", "Cluster", f"label_values({nodes}, cluster)"),
        query_variable("node", "Node", f'label_values({nodes}{{cluster=~"$cluster"}}, node)'),
        query_variable(
            "gpu",
            "GPU",
            'label_values(DCGM_FI_DEV_GPU_TEMP{cluster=~"$cluster", node=~"$node"}, gpu)',
            numeric=True,
        ),
    ]
