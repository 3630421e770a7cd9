"""Thin helpers over grafana-foundation-sdk: the variables, panel kinds and queries both
dashboards share, so every panel gets the same data source, a unit and a description.

The SDK (``grafana-foundation-sdk``, pinned in pyproject's ``tools`` extra) is needed only to
generate the dashboards, never to run the sidecar: nothing outside ``sidecar.tools.dashboards``
imports this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import (
    bargauge,
    common as common_b,
    dashboard as dash,
    heatmap,
    prometheus as prom,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder, variants as cogvariants
from grafana_foundation_sdk.models import (
    common as common_m,
    dashboard as dash_m,
    heatmap as heatmap_m,
    prometheus as prom_m,
)

from .queries import FILTER_LABELS, selector

__all__ = [
    "DATASOURCE",
    "Query",
    "ref_id",
    "Board",
    "timeseries_panel",
    "heatmap_panel",
    "stat_panel",
    "bargauge_panel",
    "table_panel",
    "thresholds",
    "dashed_threshold_lines",
    "variables",
]

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")
"""Every panel and query reads the data source the ``datasource`` variable selects."""

VARIABLE_METRIC = "llm_requests_total"
"""Label values for the filter variables come from the one series every request creates."""

GRAFANA_ANNOTATIONS = dash_m.DataSourceRef(type_val="grafana", uid="-- Grafana --")


@dataclass(frozen=True, slots=True)
class Query:
    """One Prometheus query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False
    table: bool = False
    exemplar: bool = False


def ref_id(i: int) -> str:
    """The i-th query's refId: A, B, C, ..."""
    return chr(ord("A") + i)


def _target(query: Query, i: int) -> prom.Dataquery:
    q = prom.Dataquery().expr(query.expr).ref_id(ref_id(i)).datasource(DATASOURCE)
    q = q.legend_format(query.legend or "__auto")
    if query.instant or query.table:
        q = q.instant()
    else:
        q = q.range()
    if query.heatmap:
        q = q.format(prom_m.PromQueryFormat.HEATMAP)
    elif query.table:
        q = q.format(prom_m.PromQueryFormat.TABLE)
    if query.exemplar:
        q = q.exemplar(True)
    return q


class _PanelBuilder(Protocol):
    """What every panel builder of the SDK has (each returns the builder itself)."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dash_m.DataSourceRef) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def with_target(self, target: cogbuilder.Builder[cogvariants.Dataquery]) -> Self: ...


_P = TypeVar("_P", bound=_PanelBuilder)


def _common(
    panel: _P, title: str, description: str, queries: Sequence[Query], unit: str, w: int, h: int
) -> _P:
    panel = (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(w)
        .height(h)
    )
    for i, query in enumerate(queries):
        panel = panel.with_target(_target(query, i))
    return panel


def thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    """Absolute thresholds; the first step's value is None (from -Infinity)."""
    return (
        dash.ThresholdsConfig()
        .mode(dash_m.ThresholdsMode.ABSOLUTE)
        .steps([dash_m.Threshold(value=v, color=c) for v, c in steps])
    )


def timeseries_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    w: int = 12,
    h: int = 8,
    stack: bool = False,
    min_zero: bool = True,
) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), title, description, queries, unit, w, h)
    panel = (
        panel.line_width(1)
        .fill_opacity(25 if stack else 10)
        .show_points(common_m.VisibilityMode.NEVER)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.LIST)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common_m.TooltipDisplayMode.MULTI)
            .sort(common_m.SortOrder.DESCENDING)
        )
    )
    if stack:
        panel = panel.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL))
    if min_zero:
        panel = panel.min(0)
    return panel


def dashed_threshold_lines(
    panel: timeseries.Panel, steps: Sequence[tuple[float | None, str]]
) -> timeseries.Panel:
    """Draw the thresholds as dashed horizontal lines (alert thresholds, targets)."""
    return panel.thresholds(thresholds(*steps)).thresholds_style(
        common_b.GraphThresholdsStyleConfig().mode(common_m.GraphThresholdsStyleMode.DASHED)
    )


def heatmap_panel(
    title: str, description: str, query: Query, unit: str, *, w: int = 12, h: int = 8
) -> heatmap.Panel:
    """Prometheus histogram buckets as a heatmap: y = bucket bounds in ``unit``, colour =
    observations per second in that bucket (the query is a rate of ``_bucket`` by ``le``)."""
    panel = _common(
        heatmap.Panel(), title, description, [Query(query.expr, "{{le}}", heatmap=True)], unit, w, h
    )
    return (
        panel.calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit).axis_placement(common_m.AxisPlacement.LEFT))
        .cell_values(heatmap.CellValues().unit("cps"))  # observations per second
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_m.HeatmapColorMode.SCHEME)
            .scheme("Spectral")
            .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(True)
        )
        .filter_values(heatmap.FilterValueRange().le(1e-9))
        .show_value(common_m.VisibilityMode.NEVER)
        .mode(common_m.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_legend()
    )


def stat_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    w: int = 6,
    h: int = 5,
    steps: Sequence[tuple[float | None, str]] = ((None, "text"),),
    decimals: int | None = None,
    mappings: Sequence[dash_m.ValueMapping] = (),
) -> stat.Panel:
    panel = _common(stat.Panel(), title, description, [_instant(q) for q in queries], unit, w, h)
    panel = (
        panel.thresholds(thresholds(*steps))
        .color_mode(common_m.BigValueColorMode.VALUE)
        .graph_mode(common_m.BigValueGraphMode.NONE)
        .text_mode(common_m.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    if mappings:
        panel = panel.mappings(list(mappings))
    return panel


def bargauge_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    w: int = 12,
    h: int = 8,
    steps: Sequence[tuple[float | None, str]] = ((None, "green"),),
    min_val: float | None = None,
    max_val: float | None = None,
) -> bargauge.Panel:
    panel = _common(
        bargauge.Panel(), title, description, [_instant(q) for q in queries], unit, w, h
    )
    panel = (
        panel.thresholds(thresholds(*steps))
        .display_mode(common_m.BarGaugeDisplayMode.BASIC)
        .orientation(common_m.VizOrientation.HORIZONTAL)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def table_panel(
    title: str, description: str, query: Query, unit: str, *, w: int = 12, h: int = 8
) -> table.Panel:
    panel = _common(
        table.Panel(), title, description, [Query(query.expr, query.legend, table=True)], unit, w, h
    )
    return panel.with_transformation(
        dash_m.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": {"Time": True, "Value": True, "__name__": True}},
        )
    )


def _instant(q: Query) -> Query:
    return Query(q.expr, q.legend, instant=True)


# ------------------------------------------------------------------------------- variables


_VARIABLE_HELP = {
    "cluster": "The `cluster` label, where Prometheus adds one (an external label, a Thanos or "
    "Mimir ruler). All also matches series without the label.",
    "namespace": "Kubernetes namespace of the scraped sidecar (the `namespace` target label "
    "kube-prometheus-stack adds). All also matches series without the label.",
    "llm_release": "The install of the Helm chart (or of deploy/kubernetes/) whose rules judge the sidecar: "
    "`<its namespace>/<its name>`, the `llm_release` label its PodMonitor or ServiceMonitor adds "
    "(one release per model is the usual fleet). All also matches series without the label.",
    "pod": "Pod of the scraped sidecar (the `pod` target label). All also matches series without the label.",
    "model": "The `model` label: the request's model name, bounded by --max-models / --model-allowlist "
    "(`other`, `unknown`).",
    "route": "The `route` label: the API route template (e.g. /v1/chat/completions), else `other`.",
}


def variables() -> list[cogbuilder.Builder[dash_m.VariableModel]]:
    """``datasource`` (any Prometheus), then cluster, namespace, pod, model and route, each narrowed by
    the ones before it. Multi-valued with All = ``.*``, so every panel's ``label=~"$label"``
    also matches a Prometheus outside Kubernetes, whose series have no namespace or pod."""
    out: list[cogbuilder.Builder[dash_m.VariableModel]] = [
        dash.DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Data source")
        .type("prometheus")
        .description(
            "The Prometheus that scrapes the sidecars and evaluates llm-sidecar's SLO rules."
        )
    ]
    for i, label in enumerate(FILTER_LABELS):
        narrowed_by = FILTER_LABELS[:i]
        series = selector(VARIABLE_METRIC, labels=narrowed_by) if narrowed_by else VARIABLE_METRIC
        definition = f"label_values({series}, {label})"
        out.append(
            dash.QueryVariable(label)
            .label(label)
            .description(_VARIABLE_HELP[label])
            .datasource(DATASOURCE)
            .query(
                {
                    "qryType": 1,
                    "query": definition,
                    "refId": f"PrometheusVariableQueryEditor-{label}",
                }
            )
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dash_m.VariableOption(selected=True, text="All", value="$__all"))
        )
    return out


# ------------------------------------------------------------------------------- the board


_M = TypeVar("_M")


class _Built(cogbuilder.Builder[_M]):
    """An already built panel or row, handed to the dashboard builder as is."""

    def __init__(self, model: _M) -> None:
        self._model = model

    def build(self) -> _M:
        return self._model


class _Placeable(Protocol):
    """A panel builder the board numbers and places."""

    def id(self, id_val: int) -> Self: ...
    def build(self) -> dash_m.Panel: ...


class Board:
    """A dashboard under construction: numbers panels in order (stable ids) and lays them
    out left to right, wrapping to a new line when a panel would not fit in the 24 columns;
    rows are full-width section headers."""

    def __init__(self, uid: str, title: str, description: str, tags: Sequence[str]) -> None:
        self._next_id = 1
        self._x = 0
        self._y = 0
        self._line_h = 0
        self.builder = (
            dash.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(list(tags))
            .editable()
            .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
            .time("now-3h", "now")
            .refresh("1m")
            .timezone("browser")
            .timepicker(dash.TimePicker().refresh_intervals(["30s", "1m", "5m", "15m", "1h"]))
            .annotation(
                dash.AnnotationQuery()
                .name("Annotations & Alerts")
                .datasource(GRAFANA_ANNOTATIONS)
                .built_in(1)
                .enable(True)
                .hide(True)
                .icon_color("rgba(0, 211, 255, 1)")
                .type("dashboard")
            )
            .link(
                dash.DashboardLink("llm-sidecar dashboards")
                .type(dash_m.DashboardLinkType.DASHBOARDS)
                .tags(["llm-sidecar"])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
                .icon("external link")
                .tooltip("")
                .url("")
                .target_blank(False)
            )
        )
        for variable in variables():
            self.builder = self.builder.with_variable(variable)

    def _id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n

    def _newline(self) -> None:
        self._y += self._line_h
        self._x = 0
        self._line_h = 0

    def row(self, title: str) -> Board:
        self._newline()
        model = dash.Row(title).id(self._id()).build()
        model.grid_pos = dash_m.GridPos(h=1, w=24, x=0, y=self._y)
        self.builder = self.builder.with_row(_Built(model))
        self._y += 1
        return self

    def collapsed_row(self, title: str, *panels: _Placeable) -> Board:
        """A row that starts collapsed, holding ``panels``: one line on the board until it
        is opened (Grafana keeps a collapsed row's panels inside the row), so a section that
        has no data on some deployments costs a line there, not a screen of empty panels."""
        self._newline()
        row = dash.Row(title).id(self._id()).collapsed(True).build()
        row.grid_pos = dash_m.GridPos(h=1, w=24, x=0, y=self._y)
        x, y, line_h = 0, self._y + 1, 0
        for panel in panels:
            model = panel.id(self._id()).build()
            assert model.grid_pos is not None  # span() and height() set it (_common)
            w, h = model.grid_pos.w, model.grid_pos.h
            if x + w > 24:
                x, y, line_h = 0, y + line_h, 0
            model.grid_pos = dash_m.GridPos(h=h, w=w, x=x, y=y)
            row.panels.append(model)
            x += w
            line_h = max(line_h, h)
        self.builder = self.builder.with_row(_Built(row))
        self._y += 1
        return self

    def add(self, *panels: _Placeable) -> Board:
        for panel in panels:
            model = panel.id(self._id()).build()
            assert model.grid_pos is not None  # span() and height() set it (_common)
            w, h = model.grid_pos.w, model.grid_pos.h
            if self._x + w > 24:
                self._newline()
            model.grid_pos = dash_m.GridPos(h=h, w=w, x=self._x, y=self._y)
            self.builder = self.builder.with_panel(_Built(model))
            self._x += w
            self._line_h = max(self._line_h, h)
        return self

    def build(self) -> dash_m.Dashboard:
        return self.builder.build()
