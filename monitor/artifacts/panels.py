"""Grafana dashboard JSON: panels and their targets, the grid layout, variables, annotations.

Panels are laid out left to right in rows of 24 units; a :class:`Row` starts a titled group on a
new line. What every board shares: a stable ``uid``, the ``embedding-monitor`` tag, a datasource variable
(every panel and target uses ``${datasource}``), ``model`` and ``stream`` variables (label_values
queries; retrieval boards add ``probe``, ``slice`` and ``k``), a unit on every panel, and drift
change points as annotations (increases of ``embmon_drift_change_points_total``). What each
board shows is in :mod:`monitor.artifacts.dashboards`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor.artifacts.catalog import m

DS = {"type": "prometheus", "uid": "${datasource}"}
TAG = "embedding-monitor"
SCHEMA_VERSION = 39
# the selector of the model and stream variables
MS = 'model=~"$model", stream=~"$stream"'


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    unit: str
    targets: list[Target]
    description: str = ""
    kind: str = "timeseries"  # timeseries | stat | table
    width: int = 12
    height: int = 8
    overrides: list[dict[str, Any]] = field(default_factory=list)
    mappings: list[dict[str, Any]] = field(default_factory=list)
    thresholds: list[tuple[float | None, str]] | None = None
    min: float | None = None
    max: float | None = None


@dataclass
class Row:
    """A full-width row header that groups the panels after it (Grafana's ``row`` panel)."""

    title: str


def _variable_query(name: str, label: str, query: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": True,
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "regex": "",
    }


def variables(retrieval: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
            "regex": "",
        },
        _variable_query("model", "Model", f"label_values({m('embmon_records_total')}, model)"),
        _variable_query(
            "stream", "Stream", f'label_values({m("embmon_records_total")}{{model=~"$model"}}, stream)'
        ),
    ]
    if retrieval:
        q = m("embmon_retrieval_queries")
        out += [
            _variable_query("probe", "Probe", f'label_values({q}{{model=~"$model"}}, probe)'),
            _variable_query("slice", "Slice", f'label_values({q}{{model=~"$model", probe=~"$probe"}}, slice)'),
            _variable_query(
                "k", "k", f'label_values({m("embmon_retrieval_ndcg")}{{model=~"$model", probe=~"$probe"}}, k)'
            ),
        ]
    return out


def change_point_annotation() -> dict[str, Any]:
    cp = m("embmon_drift_change_points_total")
    return {
        "name": "Drift change points",
        "datasource": DS,
        "enable": True,
        "iconColor": "orange",
        "expr": f"increase({cp}{{{MS}}}[2m]) > 0",
        "step": "1m",
        "titleFormat": "Change point: {{signal}} ({{detector}})",
        "textFormat": "{{model}} / {{stream}}",
        "tagKeys": "model,stream,signal,detector",
        "useValueForTime": False,
    }


def _builtin_annotation() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.mappings:
        defaults["mappings"] = panel.mappings
    if panel.thresholds:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": value} for value, color in panel.thresholds],
        }
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "never",
            "spanNulls": False,
        }
    options: dict[str, Any] = {}
    if panel.kind == "timeseries":
        options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                   "tooltip": {"mode": "multi", "sort": "none"}}
    elif panel.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                   "orientation": "auto", "justifyMode": "auto"}
    else:
        options = {"showHeader": True}
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DS,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "instant": t.instant or panel.kind != "timeseries",
                "range": panel.kind == "timeseries",
                "editorMode": "code",
            }
            for i, t in enumerate(panel.targets)
        ],
    }


def _row_json(row: Row, pid: int, y: int) -> dict[str, Any]:
    return {"id": pid, "type": "row", "title": row.title, "collapsed": False, "panels": [],
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}


def dashboard(uid: str, title: str, description: str, panels: Sequence[Panel | Row], *, retrieval: bool = False,
              tags: tuple[str, ...] = ()) -> dict[str, Any]:
    laid: list[dict[str, Any]] = []
    x = y = row_h = 0
    for pid, panel in enumerate(panels, start=1):
        if isinstance(panel, Row):  # starts a new line, one unit high
            y += row_h
            laid.append(_row_json(panel, pid, y))
            x, y, row_h = 0, y + 1, 0
            continue
        if x + panel.width > 24:
            x, y, row_h = 0, y + row_h, 0
        laid.append(_panel_json(panel, pid, x, y))
        x += panel.width
        row_h = max(row_h, panel.height)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": [TAG, *tags],
        "timezone": "",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {"type": "dashboards", "tags": [TAG], "asDropdown": True, "title": "Embedding monitor",
             "includeVars": True, "keepTime": True}
        ],
        "annotations": {"list": [_builtin_annotation(), change_point_annotation()]},
        "templating": {"list": variables(retrieval)},
        "panels": laid,
    }


def panel_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel (rows have none)."""
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", ())]
