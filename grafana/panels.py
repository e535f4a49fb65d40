"""Panel and variable helpers with the house defaults, so every Argus dashboard looks alike.

Every panel reads the dashboard's ``$datasource`` (a Prometheus), has a description, a unit and
thresholds, a table legend with the last and max values, and a shared sorted tooltip. Builders
are grafana-foundation-sdk's; these helpers only fix the defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import bargauge, common, dashboard, heatmap, prometheus, stat
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from argus_grafana.queries import Queries

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Every query and variable reads the Prometheus chosen in the ``datasource`` variable."""

Steps = Sequence[tuple[float | None, str]]
GOOD: Steps = ((None, "green"),)


def thresholds(steps: Steps) -> dashboard.ThresholdsConfig:
    """Absolute thresholds from ``(value, color)`` pairs; the first value is None (the base)."""
    return (dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=value, color=color) for value, color in steps]))


def above(*levels: tuple[float, str]) -> Steps:
    """Green, then the given colours from each level up (``above((1.25, "orange"))``)."""
    return ((None, "green"), *levels)


def query(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False,
          table: bool = False) -> prometheus.Dataquery:
    """A Prometheus query on ``$datasource``: a range query, or an instant one (tables, stats)."""
    target = (prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
              .legend_format(legend or "__auto"))
    target = target.instant() if instant else target.range()
    if table:
        target = target.format(pm.PromQueryFormat.TABLE)
    return target


def _legend() -> common.VizLegendOptions:
    return (common.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM).show_legend(True)
            .calcs(["lastNotNull", "max"]))


def _tooltip() -> common.VizTooltipOptions:
    return (common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
            .sort(cm.SortOrder.DESCENDING))


def link(title: str, url: str) -> dashboard.DashboardLink:
    """A data link opening in a new tab."""
    return dashboard.DashboardLink(title).url(url).target_blank(True)


def drilldown(title: str, uid: str, params: str) -> dashboard.DashboardLink:
    """A data link to another Argus dashboard, keeping the time range."""
    return (dashboard.DashboardLink(title)
            .url(f"/d/{uid}?${{__url_time_range}}&var-datasource=${{datasource}}&{params}"))


def trace_links(rank: str, job: str = "${__field.labels.job:percentencode}",
                at: str = "${__value.time}") -> list[dashboard.DashboardLink]:
    """The two Perfetto links of a point: download the window's trace, or open it in the UI.

    They go to the processor's ``/v1/traces`` routes (``$traces`` variable), which find the
    window in the trace store and redirect to a fresh presigned URL, so a link never expires.
    ``token=`` carries ``$argus_read_token`` for a processor with a read token (a data link
    cannot send headers); empty, it is ignored by a processor without one.
    """
    params = f"job={job}&rank={rank}&at={at}&token=${{{READ_TOKEN_VARIABLE}:percentencode}}"
    return [link("Open in Perfetto UI (rank ${__field.labels.rank})",
                 f"${{traces}}/v1/traces/perfetto?{params}"),
            link("Download Perfetto trace", f"${{traces}}/v1/traces/open?{params}")]


def timeseries(title: str, description: str, unit: str, targets: list[prometheus.Dataquery], *,
               steps: Steps = GOOD, threshold_line: bool = False, w: int = 12, h: int = 8,
               minimum: float | None = None, links: list | None = None,
               stack: bool = False) -> timeseries_panel.Panel:
    """A time series panel: lines, table legend, shared tooltip, thresholds (optionally drawn)."""
    panel = (timeseries_panel.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).targets(targets).span(w).height(h)
             .thresholds(thresholds(steps)).legend(_legend()).tooltip(_tooltip())
             .line_width(1).fill_opacity(10 if stack else 0).show_points(cm.VisibilityMode.NEVER)
             .span_nulls(False))
    if threshold_line:
        panel = panel.thresholds_style(common.GraphThresholdsStyleConfig()
                                       .mode(cm.GraphThresholdsStyleMode.DASHED))
    if minimum is not None:
        panel = panel.min(minimum)
    if stack:
        panel = panel.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL))
    if links:
        panel = panel.data_links(links)
    return panel


def stat_panel(title: str, description: str, unit: str, target: prometheus.Dataquery, *,
               steps: Steps = GOOD, w: int = 6, h: int = 4,
               decimals: float | None = None) -> stat.Panel:
    """A big number (last value), coloured by its thresholds."""
    panel = (stat.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).with_target(target).span(w).height(h)
             .thresholds(thresholds(steps)).color_mode(cm.BigValueColorMode.VALUE)
             .graph_mode(cm.BigValueGraphMode.NONE).text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
             .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def table(title: str, description: str, unit: str, targets: list[prometheus.Dataquery], *,
          steps: Steps = GOOD, w: int = 12, h: int = 8, colored: bool = False,
          transformations: list[dm.DataTransformerConfig] | None = None,
          links: list | None = None,
          column_units: dict[str, str] | None = None) -> table_panel.Panel:
    """A table of instant query results; ``colored`` paints value cells by their thresholds;
    ``column_units`` gives columns a unit of their own (plain, uncoloured)."""
    panel = (table_panel.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).targets(targets).span(w).height(h)
             .thresholds(thresholds(steps)).show_header(True)
             .cell_height(cm.TableCellHeight.SM).align(cm.FieldTextAlignment.AUTO)
             .inspect(False))
    if colored:
        panel = panel.cell_options(cm.TableColoredBackgroundCellOptions(
            mode=cm.TableCellBackgroundDisplayMode.BASIC))
    for transformation in transformations or ():
        panel = panel.with_transformation(transformation)
    if links:
        panel = panel.data_links(links)
    for column, column_unit in (column_units or {}).items():
        panel = panel.override_by_name(column, [
            dm.DynamicConfigValue(id_val="unit", value=column_unit),
            dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "auto"})])
    return panel


def heatmap_panel(title: str, description: str, unit: str, target: prometheus.Dataquery, *,
                  w: int = 24, h: int = 9, links: list | None = None) -> heatmap.Panel:
    """A heatmap whose rows are the query's series (no bucketing): one row per rank."""
    panel = (heatmap.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).with_target(target).span(w).height(h)
             .thresholds(thresholds(GOOD)).calculate(False).cell_gap(1)
             .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME)
                    .scheme("RdYlGn").reverse(True).exponent(0.5).steps(64)
                    .min(1.0))
             .y_axis(heatmap.YAxisConfig().unit("none").axis_label("rank"))
             .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.UNKNOWN)
                         .value(title))
             .show_value(cm.VisibilityMode.NEVER).show_legend()
             .hide_from(common.HideSeriesConfig().legend(False).tooltip(False).viz(False)))
    if links:
        panel = panel.data_links(links)
    return panel


def bar_gauge(title: str, description: str, unit: str, target: prometheus.Dataquery, *,
              steps: Steps = GOOD, w: int = 12, h: int = 8) -> bargauge.Panel:
    """Horizontal bars, one per series (last value), coloured by thresholds."""
    return (bargauge.Panel().title(title).description(description).unit(unit)
            .datasource(DATASOURCE).with_target(target).span(w).height(h)
            .thresholds(thresholds(steps)).orientation(cm.VizOrientation.HORIZONTAL)
            .display_mode(cm.BarGaugeDisplayMode.BASIC)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def transformation(kind: str, **options: object) -> dm.DataTransformerConfig:
    """A panel transformation (``merge``, ``groupingToMatrix``, ``organize``...)."""
    return dm.DataTransformerConfig(id_val=kind, options=dict(options))


# -- variables -------------------------------------------------------------------------------
def datasource_variable() -> dashboard.DatasourceVariable:
    """``$datasource``: the Prometheus (or Mimir, Thanos) holding the Argus metrics."""
    return (dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("Prometheus, Mimir or Thanos holding the Argus metrics and rules."))


def query_variable(name: str, label: str, expr: str, description: str, *, multi: bool = False,
                   numeric: bool = False) -> dashboard.QueryVariable:
    """A variable filled from label values of a series (refreshed when the time range moves)."""
    variable = (dashboard.QueryVariable(name).label(label).description(description)
                .datasource(DATASOURCE)
                .query(expr)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.NUMERICAL_ASC if numeric
                      else dm.VariableSort.ALPHABETICAL_ASC))
    if multi:
        variable = variable.multi(True).include_all(True)
    return variable


def job_variable(q: Queries, multi: bool) -> dashboard.QueryVariable:
    """``$job``: the training job (several on the overview and pipeline pages)."""
    return query_variable("job", "Job", q.VAR_JOB,
                          "Training job, as the exporters report it (ARGUS_JOB).", multi=multi)


def axis_variable(q: Queries) -> dashboard.CustomVariable:
    """``$axis``: the parallel axis whose groups are compared (ranks equal on every other)."""
    options = [dm.VariableOption(text=axis, value=axis, selected=axis == "dp")
               for axis in q.AXES]
    return (dashboard.CustomVariable("axis").label("Axis").values(",".join(q.AXES))
            .description("Parallel axis compared: a rank against the ranks that differ from it "
                         "only on this axis (its X-group).")
            .current(dm.VariableOption(text="dp", value="dp", selected=True)).options(options))


def traces_variable() -> dashboard.TextBoxVariable:
    """``$traces``: base URL of a processor (or ``argus traces serve``) for the trace links."""
    return (dashboard.TextBoxVariable("traces").label("Trace links via")
            .default_value("http://localhost:9700")
            .description("Base URL of an Argus processor reachable from your browser; its "
                         "/v1/traces routes find a rank's Perfetto file for a time."))


READ_TOKEN_VARIABLE = "argus_read_token"


def read_token_variable() -> dashboard.TextBoxVariable:
    """``$argus_read_token``: the processors' read token for the trace links; hidden and empty
    by default (set it with ``?var-argus_read_token=...`` or in the provisioned JSON)."""
    return (dashboard.TextBoxVariable(READ_TOKEN_VARIABLE).label("Trace read token")
            .default_value("").hide(dm.VariableHide.HIDE_VARIABLE)
            .description("Read token of the processors' /v1/traces routes, sent as token= "
                         "on the trace links; leave empty for processors without one."))


def assign_ids(model: dm.Dashboard) -> dm.Dashboard:
    """Give every panel (rows and their panels included) a stable id: its position, from 1."""
    next_id = 1
    for panel in model.panels or ():
        panel.id_val = next_id
        next_id += 1
        for inner in getattr(panel, "panels", None) or ():
            inner.id_val = next_id
            next_id += 1
    return model


# -- dashboards ------------------------------------------------------------------------------
TAGS = ["argus", "fail-slow"]
UIDS = {"overview": "argus-overview", "stragglers": "argus-stragglers",
        "kernels": "argus-kernels", "pipeline": "argus-pipeline", "suspects": "argus-suspects"}


def new_dashboard(uid: str, title: str, description: str, extra_tags: list[str],
                  variables: list) -> dashboard.Dashboard:
    """A dashboard with the house settings: stable uid, tags, last hour, 30 s refresh, UTC,
    shared crosshair, links to the other Argus dashboards (keeping time and variables)."""
    board = (dashboard.Dashboard(title).uid(uid).description(description)
             .tags([*TAGS, *extra_tags]).time("now-1h", "now").refresh("30s").timezone("utc")
             .tooltip(dm.DashboardCursorSync.CROSSHAIR).readonly()
             .timepicker(dashboard.TimePicker().refresh_intervals(
                 ["10s", "30s", "1m", "5m", "15m"]))
             .link(dashboard.DashboardLink("Argus").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags(TAGS[:1]).as_dropdown(False).include_vars(True).keep_time(True)))
    for variable in variables:
        board = board.with_variable(variable)
    return board
