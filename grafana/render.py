"""Draw a dashboard's panels with matplotlib from the same queries, for docs/dashboards.md.

No Grafana runs here, so this is a reader's preview, not a screenshot: every panel's queries go
to Prometheus exactly as :mod:`argus_grafana.check` sends them, and each panel type gets a
plain rendering at its grid position (time series as lines with their thresholds and the
dashboard's annotations as markers, stats as numbers, tables and the rank x phase matrix as
coloured tables, heatmaps as images, bar gauges as bars). A panel whose data this Prometheus
cannot hold is drawn grey, with the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from argus_grafana import check
from argus_grafana import queries as q
from argus_grafana.prometheus import PrometheusError, api

ROW_IN = 0.36  # inches per grid row
WIDTH_IN = 18.0
_LEGEND = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_COLORS = {"green": "#56a64b", "orange": "#ff9830", "red": "#e02f44", "purple": "#a352cc"}


@dataclass
class Series:
    """One query result series: its labels, the name Grafana would show, its points."""

    labels: dict[str, str]
    name: str
    times: list[float]
    values: list[float]


@dataclass
class RenderStats:
    """What a rendering drew."""

    panels: int = 0
    drawn: int = 0
    placeholders: int = 0


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt or fmt == "__auto":
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        return ", ".join(f"{k}={v}" for k, v in shown.items()) or labels.get("__name__", "")
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def _format(value: float, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if unit == "percentunit":
        return f"{value:.1%}" if abs(value) < 0.1 else f"{value:.0%}"
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit in ("bytes", "Bps"):
        for suffix in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024 or suffix == "GiB":
                return f"{value:.3g} {suffix}" + ("/s" if unit == "Bps" else "")
            value /= 1024
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "h":
        return f"{value:.2f} h"
    if unit == "cps":
        return f"{value:.3g}/s"
    return f"{value:.4g}"


class Renderer:
    """Runs a dashboard's queries against one Prometheus and draws them."""

    def __init__(self, url: str, start_s: float, end_s: float, values: dict[str, list[str]],
                 present: set[str]):
        self.url = url
        self.start_s = start_s
        self.end_s = end_s
        self.values = values
        self.present = present
        self.step = max(15.0, (end_s - start_s) / 240)

    def series(self, expr: str, legend: str, instant: bool) -> list[Series]:
        """Run one query; its series named as Grafana would name them."""
        sent = check.substitute(expr, self.values)
        legend = check.substitute(legend, self.values)
        if instant:
            data = api(self.url, "/api/v1/query", {"query": sent, "time": f"{self.end_s:.3f}"})
            return [Series(item["metric"], _legend(legend, item["metric"]),
                           [float(item["value"][0])], [float(item["value"][1])])
                    for item in data["result"]]
        data = api(self.url, "/api/v1/query_range", {
            "query": sent, "start": f"{self.start_s:.3f}", "end": f"{self.end_s:.3f}",
            "step": f"{self.step:g}"})
        return [Series(item["metric"], _legend(legend, item["metric"]),
                       [float(t) for t, _ in item["values"]],
                       [float(v) for _, v in item["values"]]) for item in data["result"]]

    def missing(self, exprs: list[str]) -> str | None:
        """Why this Prometheus cannot answer these queries, or None."""
        for expr in exprs:
            absent = q.sources(expr) - self.present
            if absent:
                return check.SKIP_REASONS[sorted(absent)[0]]
        return None

    def render(self, board: dict, path: Path, title_values: str = "") -> RenderStats:
        """Draw every panel of ``board`` into one PNG at ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = [p for p in board["panels"] if p["type"] != "row"]
        rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
        height = rows * ROW_IN + 0.8
        fig = plt.figure(figsize=(WIDTH_IN, height), dpi=80)
        fig.patch.set_facecolor("#f4f5f5")
        fig.text(0.01, 1 - 0.35 / height, f"{board['title']}   {title_values}", fontsize=14,
                 weight="bold", va="top")
        markers = self._annotations(board)
        stats = RenderStats()
        for panel in panels:
            grid = panel["gridPos"]
            top = 0.8 + grid["y"] * ROW_IN
            left = 0.045 if panel["type"] in ("timeseries", "bargauge", "heatmap") else 0.01
            box = [grid["x"] / 24 + left, 1 - (top + grid["h"] * ROW_IN) / height + 0.25 / height,
                   grid["w"] / 24 - left - 0.012, (grid["h"] * ROW_IN - 0.6) / height]
            ax = fig.add_axes(box)
            title = check.substitute(panel["title"], self.values)
            ax.set_title(title, fontsize=10, loc="left", weight="bold")
            stats.panels += 1
            reason = self.missing([t["expr"] for t in panel["targets"]
                                   if panel["type"] != "table" or t["refId"] == "A"])
            if reason:
                self._placeholder(ax, reason)
                stats.placeholders += 1
                continue
            try:
                self._draw(ax, panel, markers)
                stats.drawn += 1
            except PrometheusError as exc:
                self._placeholder(ax, f"query failed: {exc}")
                stats.placeholders += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, facecolor=fig.get_facecolor())
        plt.close(fig)
        return stats

    # -- panel types ------------------------------------------------------------------------
    def _draw(self, ax, panel: dict, markers: list[tuple[float, float, str]]) -> None:
        defaults = panel["fieldConfig"]["defaults"]
        unit = defaults.get("unit", "short")
        kind = panel["type"]
        targets = panel["targets"]
        if kind == "timeseries":
            self._timeseries(ax, panel, targets, unit, markers)
        elif kind == "stat":
            self._stat(ax, targets[0], unit, defaults)
        elif kind == "bargauge":
            self._bars(ax, targets[0], unit, defaults)
        elif kind == "heatmap":
            self._heatmap(ax, targets[0], unit)
        elif kind == "table":
            self._table(ax, panel, unit, defaults)
        else:
            self._placeholder(ax, f"panel type {kind} is not drawn here")

    def _timeseries(self, ax, panel, targets, unit, markers) -> None:
        import matplotlib.dates as mdates

        drawn = 0
        for target in targets:
            if self.missing([target["expr"]]):
                continue
            for series in self.series(target["expr"], target.get("legendFormat", ""), False):
                times = [datetime.fromtimestamp(t, UTC) for t in series.times]
                ax.plot(times, series.values, linewidth=1.2, label=series.name[:40])
                drawn += 1
        custom = panel["fieldConfig"]["defaults"].get("custom", {})
        if custom.get("thresholdsStyle", {}).get("mode") not in (None, "off"):
            for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
                ax.axhline(step["value"], color=_COLORS.get(step["color"], "red"),
                           linestyle="--", linewidth=1)
        for begin, end, color in markers:
            ax.axvspan(datetime.fromtimestamp(begin, UTC), datetime.fromtimestamp(end, UTC),
                       color=color, alpha=0.18, linewidth=0)
        ax.yaxis.set_major_formatter(lambda v, _: _format(v, unit))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=UTC))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if 0 < drawn <= 12:
            ax.legend(fontsize=7, loc="upper left", ncols=min(drawn, 4), framealpha=0.6)
        if drawn == 0:
            self._placeholder(ax, "no data")

    def _stat(self, ax, target, unit, defaults) -> None:
        series = self.series(target["expr"], target.get("legendFormat", ""), True)
        ax.axis("off")
        if not series:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=16, color="grey")
            return
        for i, s in enumerate(series[:4]):
            y = 1 - (i + 0.6) / max(len(series[:4]), 1)
            ax.text(0.02, y, s.name, fontsize=9, va="center", transform=ax.transAxes)
            ax.text(0.98, y, _format(s.values[-1], unit), fontsize=16, va="center", ha="right",
                    weight="bold", color=_threshold_color(s.values[-1], defaults),
                    transform=ax.transAxes)

    def _bars(self, ax, target, unit, defaults) -> None:
        series = sorted(self.series(target["expr"], target.get("legendFormat", ""), True),
                        key=lambda s: int(s.labels.get("rank", 0)) if
                        s.labels.get("rank", "").isdigit() else 0)
        values = [s.values[-1] for s in series]
        ax.barh([s.name for s in series], values,
                color=[_threshold_color(v, defaults) for v in values])
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(lambda v, _: _format(v, unit))
        ax.tick_params(labelsize=8)

    def _heatmap(self, ax, target, unit) -> None:
        import numpy as np

        series = sorted(self.series(target["expr"], target.get("legendFormat", ""), False),
                        key=lambda s: int(s.name) if s.name.isdigit() else s.name)
        if not series:
            self._placeholder(ax, "no data")
            return
        grid = np.arange(self.start_s, self.end_s + 1, self.step)
        image = np.full((len(series), len(grid)), np.nan)
        for row, s in enumerate(series):
            index = np.searchsorted(grid, s.times)
            image[row, np.clip(index, 0, len(grid) - 1)] = s.values
        shown = ax.imshow(image, aspect="auto", cmap="RdYlGn_r", vmin=1.0,
                          vmax=max(1.5, float(np.nanmax(image))), interpolation="nearest",
                          extent=(0, (self.end_s - self.start_s) / 60, len(series) - 0.5, -0.5))
        ax.set_yticks(range(len(series)), [f"rank {s.name}" for s in series], fontsize=7)
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.figure.colorbar(shown, ax=ax, fraction=0.02, pad=0.01,
                           format=lambda v, _: _format(v, unit))

    def _table(self, ax, panel, unit, defaults) -> None:
        ax.axis("off")
        frames = []
        for target in panel["targets"]:
            if self.missing([target["expr"]]):
                continue
            frames.append((target["refId"], self.series(target["expr"], "", True)))
        transforms = {t["id"]: t.get("options", {}) for t in panel.get("transformations", ())}
        if "groupingToMatrix" in transforms:
            options = transforms["groupingToMatrix"]
            self._matrix(ax, frames[0][1], options["rowField"], options["columnField"], unit,
                         defaults)
            return
        rows, columns = _merge(frames, transforms.get("organize", {}))
        if "sortBy" in transforms:
            for rule in transforms["sortBy"].get("sort", ()):
                rows.sort(key=lambda row, f=rule["field"]: -row[f] if isinstance(
                    row.get(f), float) else math.inf)
        if not rows:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="grey")
            return
        units = {o["matcher"]["options"]: p["value"] for o in panel["fieldConfig"]["overrides"]
                 if o["matcher"]["id"] == "byName" for p in o["properties"] if p["id"] == "unit"}
        fit = max(1, int(panel["gridPos"]["h"] * 1.6) - 2)  # rows that fit the panel
        cells = [[_cell(row.get(c), units.get(c, unit)) for c in columns] for row in rows[:fit]]
        table = ax.table(cellText=cells, colLabels=columns, loc="upper center",
                         cellLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.scale(1, 1.2)

    def _matrix(self, ax, series, row_field, column_field, unit, defaults) -> None:
        rows = sorted({s.labels.get(row_field, "") for s in series},
                      key=lambda v: int(v) if v.isdigit() else v)
        columns = sorted({s.labels.get(column_field, "") for s in series})
        if not rows or not columns:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="grey")
            return
        value = {(s.labels.get(row_field), s.labels.get(column_field)): s.values[-1]
                 for s in series}
        cells = [[_format(value.get((r, c), math.nan), unit) for c in columns] for r in rows]
        colors = [[_threshold_color(value.get((r, c), math.nan), defaults, light=True)
                   for c in columns] for r in rows]
        height = min(1.0, 0.085 * (len(rows) + 1))
        table = ax.table(cellText=cells, cellColours=colors, rowLabels=[f"rank {r}" for r in rows],
                         colLabels=columns, cellLoc="center",
                         bbox=[0.08, 1 - height, 0.92, height])
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.scale(1, 1.2)

    def _annotations(self, board: dict) -> list[tuple[float, float, str]]:
        """(start, end, colour) of each run of annotation points (Grafana draws regions)."""
        out = []
        for annotation in board.get("annotations", {}).get("list", ()):
            expr = annotation.get("expr")
            if not expr or self.missing([expr]):
                continue
            color = _COLORS.get(annotation.get("iconColor"), "grey")
            times = sorted({t for series in self.series(expr, "", False)
                            for t, v in zip(series.times, series.values, strict=True)
                            if math.isfinite(v)})
            begin = previous = None
            for t in times:
                if begin is None or t - previous > 2 * self.step:
                    if begin is not None:
                        out.append((begin, previous + self.step, color))
                    begin = t
                previous = t
            if begin is not None:
                out.append((begin, previous + self.step, color))
        return out

    @staticmethod
    def _placeholder(ax, reason: str) -> None:
        import textwrap

        ax.set_facecolor("#e4e4e4")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap(reason, 60)), ha="center", va="center",
                fontsize=8, color="#555555", transform=ax.transAxes)


def _threshold_color(value: float, defaults: dict, light: bool = False) -> str:
    color = "#cccccc"
    if value is not None and math.isfinite(value):
        for step in defaults.get("thresholds", {}).get("steps", ()):
            if step["value"] is None or value >= step["value"]:
                color = _COLORS.get(step["color"], step["color"])
    if light and color.startswith("#") and len(color) == 7:
        rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
        color = "#" + "".join(f"{int(c + (255 - c) * 0.55):02x}" for c in rgb)
    return color


def _cell(value, unit: str) -> str:
    """A table cell: numbers (query values) in the column's unit, labels as they are."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}" if unit == "none" else _format(value, unit)
    return str(value)


def _merge(frames: list[tuple[str, list[Series]]], organize: dict) -> tuple[list[dict], list]:
    """Grafana's ``merge``: rows of several instant queries joined on their shared labels."""
    rows: dict[tuple, dict] = {}
    several = len(frames) > 1
    for ref, series in frames:
        for s in series:
            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            column = f"Value #{ref}" if several else "Value"
            match = next((key for key, row in rows.items()
                          if all(row.get(k) == v for k, v in labels.items() if k in row)
                          and any(k in row for k in labels)), None)
            if match is None:
                match = tuple(sorted(labels.items()))
                rows[match] = dict(labels)
            rows[match][column] = s.values[-1]
    renamed = organize.get("renameByName", {})
    excluded = {k for k, v in organize.get("excludeByName", {}).items() if v}
    out = [{renamed.get(k, k): v for k, v in row.items() if k not in excluded}
           for row in rows.values()]
    columns = []
    for row in out:
        columns += [c for c in row if c not in columns]
    return out, columns
