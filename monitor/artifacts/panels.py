"""Grafana dashboards built with Grafana's own typed builders (``grafana-foundation-sdk``).

Panels are laid out left to right in rows of 24 units by the SDK's dashboard builder; a :class:`Row`
starts a titled group on a new line. What every board shares: a stable ``uid``, the
``embedding-monitor`` tag, a datasource variable (every panel and target uses ``${datasource}``),
``model`` and ``stream`` variables (label_values queries; retrieval boards add ``probe``, ``slice``
and ``k``), a unit on every panel, and drift change points as annotations (increases of
``embmon_drift_change_points_total``). What each board shows is in :mod:`monitor.artifacts.dashboards`.

What the SDK cannot express stays hand-written, and only that (:data:`BEYOND_THE_SDK`): the SDK's
annotation model has no field for a Prometheus annotation's options (``step``, ``titleFormat``,
``textFormat``, ``tagKeys``, ``useValueForTime``), so they are added to the change-point annotation
after the SDK has encoded the board. ``tests/artifacts/test_dashboards.py`` decodes every board with
the SDK's models and fails on any other field the schema does not know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import QueryEditorMode

from monitor.artifacts.catalog import m

DS = {"type": "prometheus", "uid": "${datasource}"}
TAG = "embedding-monitor"
SCHEMA_VERSION = 39
# the selector of the model and stream variables
MS = 'model=~"$model", stream=~"$stream"'
CHANGE_POINTS = "Drift change points"
# The Prometheus annotation options the SDK's AnnotationQuery has no field for (see the module docstring).
BEYOND_THE_SDK = {
    CHANGE_POINTS: {
        "step": "1m",
        "titleFormat": "Change point: {{signal}} ({{detector}})",
        "textFormat": "{{model}} / {{stream}}",
        "tagKeys": "model,stream,signal,detector",
        "useValueForTime": False,
    },
}

_DATASOURCE = model.DataSourceRef(type_val=DS["type"], uid=DS["uid"])


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Override:
    """Field properties for the series of one query (``by="query"``: its refId) or of one name."""

    by: Literal["query", "name"]
    match: str
    properties: tuple[tuple[str, Any], ...]


@dataclass
class Panel:
    title: str
    unit: str
    targets: list[Target]
    description: str = ""
    kind: Literal["timeseries", "stat", "table"] = "timeseries"
    width: int = 12
    height: int = 8
    overrides: list[Override] = field(default_factory=list)
    mappings: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # value -> (text, colour)
    thresholds: list[tuple[float | None, str]] | None = None
    min: float | None = None
    max: float | None = None


@dataclass
class Row:
    """A full-width row header that groups the panels after it (Grafana's ``row`` panel)."""

    title: str


def _variable_query(name: str, label: str, query: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(_DATASOURCE)
        .query({"query": query, "refId": f"{name}-variable"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .options([])
        .hide(model.VariableHide.DONT_HIDE)
        .regex("")
    )


def variables(retrieval: bool = False) -> list[dash.QueryVariable | dash.DatasourceVariable]:
    out: list[dash.QueryVariable | dash.DatasourceVariable] = [
        dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        .hide(model.VariableHide.DONT_HIDE),
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


def change_point_annotation() -> dash.AnnotationQuery:
    cp = m("embmon_drift_change_points_total")
    return (
        dash.AnnotationQuery()
        .name(CHANGE_POINTS)
        .datasource(_DATASOURCE)
        .enable(True)
        .hide(False)
        .icon_color("orange")
        .expr(f"increase({cp}{{{MS}}}[2m]) > 0")
    )


def _targets(panel: Panel) -> list[prometheus.Dataquery]:
    out = []
    for i, t in enumerate(panel.targets):
        query = (
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + i))
            .datasource(_DATASOURCE)
            .expr(t.expr)
            .legend_format(t.legend or "__auto")
            .editor_mode(QueryEditorMode.CODE)
        )
        out.append(query.range() if panel.kind == "timeseries" and not t.instant else query.instant())
    return out


def _timeseries() -> timeseries.Panel:
    return (
        timeseries.Panel()
        .draw_style(common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(0)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM).show_legend(True))
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                 .sort(common.SortOrder.NONE))
    )


def _stat() -> stat.Panel:
    return (
        stat.Panel()
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .orientation(common.VizOrientation.AUTO)
        .justify_mode(common.BigValueJustifyMode.AUTO)
    )


def _panel(panel: Panel, pid: int) -> timeseries.Panel | stat.Panel | table.Panel:
    built: timeseries.Panel | stat.Panel | table.Panel
    if panel.kind == "timeseries":
        built = _timeseries()
    elif panel.kind == "stat":
        built = _stat()
    else:
        built = table.Panel().show_header(True)
    built = (
        built.id(pid)
        .title(panel.title)
        .description(panel.description)
        .datasource(_DATASOURCE)
        .span(panel.width)
        .height(panel.height)
        .unit(panel.unit)
        .targets(_targets(panel))  # type: ignore[arg-type]  # the SDK types targets as its Dataquery variant
    )
    if panel.min is not None:
        built = built.min(panel.min)
    if panel.max is not None:
        built = built.max(panel.max)
    if panel.mappings:
        built = built.mappings([model.ValueMap(options={
            value: model.ValueMappingResult(text=text, color=colour) for value, (text, colour) in panel.mappings.items()
        })])
    if panel.thresholds:
        built = built.thresholds(dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
            [model.Threshold(value=value, color=colour) for value, colour in panel.thresholds]))
    for override in panel.overrides:
        properties = [model.DynamicConfigValue(id_val=key, value=value) for key, value in override.properties]
        if override.by == "query":
            built = built.override_by_query(override.match, properties)
        else:
            built = built.override_by_name(override.match, properties)
    return built


def dashboard(uid: str, title: str, description: str, panels: Sequence[Panel | Row], *, retrieval: bool = False,
              tags: tuple[str, ...] = ()) -> dict[str, Any]:
    """The board as Grafana's JSON model: built with the SDK, encoded by it, plus :data:`BEYOND_THE_SDK`."""
    board = (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, *tags])
        .timezone("")
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("1m")
        .time("now-6h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        .link(dash.DashboardLink("Embedding monitor").type(model.DashboardLinkType.DASHBOARDS).tags([TAG])
              .as_dropdown(True).include_vars(True).keep_time(True))
        .annotation(change_point_annotation())
        .variables(variables(retrieval))  # type: ignore[arg-type]  # a list of builders of one model
    )
    for pid, panel in enumerate(panels, start=1):
        if isinstance(panel, Row):
            board = board.with_row(dash.Row(panel.title).id(pid))
        else:
            board = board.with_panel(_panel(panel, pid))
    built = board.build()
    built.schema_version = SCHEMA_VERSION
    encoded: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    for annotation in encoded["annotations"]["list"]:
        annotation.update(BEYOND_THE_SDK.get(annotation["name"], {}))
    return encoded


def decoded(board: Mapping[str, Any]) -> dict[str, Any]:
    """``board`` decoded by the SDK's dashboard model (and each panel's own options and field config), then
    encoded again: what of it Grafana's schema knows. A field the schema does not know is left out."""
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    register_default_plugins()
    typed = model.Dashboard.from_json(json.loads(json.dumps(board)))
    out: dict[str, Any] = json.loads(json.dumps(typed, cls=JSONEncoder))
    return out


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel (rows have none)."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", ())]
