"""What every generated promtool test is built from: input series, rank labels, the
alert's expected labels and annotations (its templates filled in by hand), and the
"nothing before ``for`` runs out, firing right after" checks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from argus_core.rules.config import RulesConfig, format_duration


@dataclass
class Series:
    """One input series: labels and one value per interval (None = no sample)."""

    name: str
    labels: dict[str, str]
    values: list[float | str | None] = field(default_factory=list)  # "stale": a marker

    def document(self) -> dict:
        """The promtool ``input_series`` entry."""
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        return {"series": f"{self.name}{{{inner}}}", "values": values_text(self.values)}


def values_text(values: list[float | str | None]) -> str:
    """promtool's value list: runs of one value as ``vxN``, missing samples as ``_``,
    staleness markers as ``stale``."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        text = ("_" if values[i] is None else values[i] if isinstance(values[i], str)
                else number_text(values[i]))
        if j > i and values[i] is not None and not isinstance(values[i], str):
            parts.append(f"{text}x{j - i}")
        else:
            parts.extend([text] * (j - i + 1))
        i = j + 1
    return " ".join(parts)


def number_text(value: float) -> str:
    """A sample as promtool reads it: 12 significant digits, so that the generated files do
    not change with the last bits of a machine's vectorised exp and log."""
    return str(int(value)) if float(value).is_integer() else repr(float(f"{value:.12g}"))


def rank_labels(config: RulesConfig, job: str, rank: int, dp: int = 0, tp: int = 0,
                pp: int = 0, ep: int = 0, host: str = "node-0") -> dict[str, str]:
    """The exporter's identity labels (exporters/identity.py), plus what the configured
    exporter selector requires."""
    return {**matchers(config.selectors.exporters), "job": job, "rank": str(rank),
            "host": host, "dp": str(dp), "tp": str(tp), "pp": str(pp), "ep": str(ep)}


def quantile(q: float, values: list[float]) -> float:
    """PromQL's quantile(): linear interpolation between closest ranks (promql/quantile.go)."""
    ordered = sorted(values)
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def alert_labels(config: RulesConfig, rule: dict, **labels: str) -> dict[str, str]:
    """The labels an alert fires with: ``labels`` and the rule's own (severity, level)."""
    return {**labels, **rule["labels"]}


_IF = re.compile(r"\{\{ if (\S+) \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}")


def annotations(rule: dict, **values: str) -> dict[str, str]:
    """The rule's annotations with its templates filled in by hand (exact text); an ``{{ if
    $labels.x }}`` takes its first branch when ``$labels.x`` is given."""
    out = {}
    for key, text in rule["annotations"].items():
        text = _IF.sub(lambda m: m.group(2) if values.get(m.group(1)) else m.group(3), text)
        for name, value in values.items():
            text = text.replace("{{ " + name + " }}", value)
        out[key] = text
    return out


class Steps:
    """Counters and rolling-window gauges of ranks stepping in lock-step, one sample per
    interval: ``steps`` per interval of ``step_s`` seconds each, plus events."""

    def __init__(self, config: RulesConfig, samples: int, steps_per_interval: int = 4,
                 start_steps: int = 100):
        self.config = config
        self.samples = samples
        self.per = steps_per_interval
        self.start = start_steps
        self.step_s = config.evaluation_interval / steps_per_interval

    def series(self, labels: dict[str, str], host_s: float = 0.0,
               stall: dict[int, float] | None = None, stalled: bool = False,
               slow_from: int | None = None, factor: float = 1.0) -> list[Series]:
        """Counters and window gauges of one rank. ``stall[k]`` adds seconds to one step in
        interval k (every rank's wall; only a ``stalled`` rank's GPU stays flat);
        ``slow_from`` multiplies every step time from that interval on."""
        stall = stall or {}
        window = self.config.exporter_window_steps
        history: list[float] = [self.step_s] * window
        steps, wall, gpu = [], [], []
        w_max, w_median = [], []
        total_steps, total_wall, total_gpu = float(self.start), 0.0, 0.0
        for k in range(self.samples):
            if k > 0:
                for i in range(self.per):
                    step = self.step_s * (factor if slow_from is not None and k >= slow_from
                                          else 1.0)
                    extra = stall.get(k, 0.0) if i == 0 else 0.0
                    history = [*history[1:], step + extra]
                    total_steps += 1
                    total_wall += step + extra
                    total_gpu += step - host_s + (0.0 if stalled else extra)
            steps.append(total_steps)
            wall.append(round(total_wall, 6))
            gpu.append(round(total_gpu, 6))
            ordered = sorted(history)
            w_max.append(ordered[-1])
            w_median.append((ordered[window // 2 - 1] + ordered[window // 2]) / 2
                            if window % 2 == 0 else ordered[window // 2])
        return [Series("argus_steps_total", labels, steps),
                Series("argus_step_seconds_total", labels, wall),
                Series("argus_step_gpu_seconds_total", labels, gpu),
                Series("argus_step_window_seconds", {**labels, "stat": "max"}, w_max),
                Series("argus_step_window_seconds", {**labels, "stat": "median"}, w_median)]


def rule_named(groups: list[dict], name: str) -> dict:
    """The alerting rule called ``name`` among ``groups``."""
    return next(r for g in groups for r in g["rules"] if r.get("alert") == name)


def at_time(config: RulesConfig, evaluations: int) -> str:
    """promtool's ``eval_time`` of evaluation number ``evaluations``."""
    return format_duration(evaluations * config.evaluation_interval)


def intervals(config: RulesConfig, seconds: float) -> int:
    """How many evaluation intervals ``seconds`` is."""
    return round(seconds / config.evaluation_interval)


def unit_test(config: RulesConfig, name: str, series: list[Series], alerts=(), exprs=()) -> dict:
    """One promtool test: its input series, alert checks and expression checks."""
    test = {"name": name, "interval": format_duration(config.evaluation_interval),
            "input_series": [s.document() for s in series]}
    if alerts:
        test["alert_rule_test"] = list(alerts)
    if exprs:
        test["promql_expr_test"] = list(exprs)
    return test


def check(config: RulesConfig, at: int, alertname: str, alerts: list[dict]) -> dict:
    """An alert_rule_test: exactly ``alerts`` of ``alertname`` firing at evaluation ``at``."""
    return {"eval_time": at_time(config, at), "alertname": alertname, "exp_alerts": alerts}


def expect(labels: dict[str, str], texts: dict[str, str]) -> dict:
    """One expected alert: its labels and annotations (``texts``), exactly."""
    return {"exp_labels": labels, "exp_annotations": texts}


def fires(config: RulesConfig, name: str, onset: int, for_s: float, expected: list[dict]):
    """Nothing one evaluation before ``for`` runs out (unless ``for`` is zero: then nothing one
    evaluation before the onset), the expected alerts right after."""
    due = onset + intervals(config, for_s)
    return [check(config, due - 1, name, []), check(config, due, name, expected)]


def humanize_duration(v: float) -> str:
    """Prometheus's ``humanizeDuration`` template function (template/template.go)."""
    if v == 0:
        return "0s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = int(v)
        seconds = v - whole + whole % 60
        minutes, hours, days = (whole // 60) % 60, (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {int(seconds)}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {int(seconds)}s"
        if minutes:
            return f"{sign}{minutes}m {int(seconds)}s"
        return f"{sign}{seconds:.4g}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return f"{v:.4g}{prefix}s"


def matchers(text: str) -> dict[str, str]:
    """'job="x",a="b"' -> {"job": "x", "a": "b"}: labels that satisfy a selector of equality
    matchers (tests are generated for those; a regex selector needs hand-made series)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if value.startswith(("~", "=")) or key.endswith("!"):
            raise ValueError(f"selector {text!r}: generated tests need equality matchers")
        out[key.strip()] = value.strip().strip('"')
    return out
