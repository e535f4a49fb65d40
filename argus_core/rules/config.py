"""The one place users change Argus's Prometheus rules: selectors, windows, thresholds, `for`s.

Mixin style (node-mixin, kubernetes-mixin): every rule, alert and the Alertmanager example is
generated from a ``RulesConfig``; users override keys in a YAML file (``argus rules --config
FILE``) instead of editing generated YAML. The detection thresholds are the core's own
(``L1Config``, ``L2Config``: ``RulesConfig`` reads its defaults from them), so the rules and
``argus diagnose`` judge with the same numbers; re-align them by changing the core, not this
file.

Durations are seconds here and Prometheus durations (``2m``, ``600ms``) in files. The production
defaults assume a 15 s scrape and evaluation interval and steps of ~2-10 s. ``scaled(k)``
divides every duration by ``k``: the local stack and the tests run the same rules k times faster.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from argus_core.detect.cost import MIN_COST_SHARE
from argus_core.detect.l1 import L1Config
from argus_core.detect.l2 import L2Config
from argus_core.score.core_adapter import PROMQL_AXES, WINDOW_STEPS
from argus_core.timeparse import parse_duration

_L1 = L1Config()
_L2 = L2Config()

# Where L2 comes from: the scorer runs the core's L2 and the rules rename its small results
# (the default), or the rules compute the compute-phase comparisons themselves in PromQL.
L2_SCORER, L2_PROMQL = "scorer", "promql"
L2_SOURCES = (L2_SCORER, L2_PROMQL)


def _doc(text: str, default, **kwargs):
    """A dataclass field whose documentation travels with it (into the defaults file)."""
    return field(default=default, metadata={"doc": text, **kwargs})


def _duration(text: str, default: float, scaled: bool = True):
    return _doc(text, default, duration=True, scaled=scaled)


RUNBOOK_PATH = "docs/runbook.md"  # the runbook's page, relative to the repository root

LOOKBACK_S = 300.0  # Prometheus's lookback delta: a remote-written series without staleness
# markers stays visible this long after its last sample


EXPORTERS_SCRAPE_JOB = "argus-exporters"
PROCESSOR_SCRAPE_JOB = "argus-processor"
SCORER_SCRAPE_JOB = "argus-scorer"
ACT_SCRAPE_JOB = "argus-act"
"""Scrape job names of the exporters, processors and scorers: what the local stack and the
documented scrape configs call them, and what the ``*_up`` selectors match by default."""


@dataclass(frozen=True)
class Selectors:
    """Label matchers that pick Argus's series out of a shared Prometheus."""

    exporters: str = _doc("extra matchers on every exporter series, e.g. 'cluster=\"a\"'", "")
    processor: str = _doc("extra matchers on the processors' series", "")
    scorer: str = _doc("extra matchers on the scorers' series", "")
    exporters_up: str = _doc("the exporters' scrape targets, for `up`",
                             f'job="{EXPORTERS_SCRAPE_JOB}"')
    processor_up: str = _doc("the processors' scrape targets, for `up`",
                             f'job="{PROCESSOR_SCRAPE_JOB}"')
    scorer_up: str = _doc("the scorers' scrape targets, for `up`", f'job="{SCORER_SCRAPE_JOB}"')
    vector_scrape: str = _doc("Vector's source that scrapes the exporters and processors "
                              "(remote-write mode), for vector_component_errors_total",
                              'component_id="argus_scrape"')


@dataclass(frozen=True)
class RulesConfig:
    """Everything the generated rules, alerts, tests and Alertmanager routing depend on."""

    selectors: Selectors = field(default_factory=Selectors)
    l2_source: str = _doc("where L2 comes from: 'scorer' (the scorer runs the core's L2 on "
                          "every axis and the rules rename its small results; L2 alerts need "
                          "a scorer) or 'promql' (the rules compare compute phases on `axes` "
                          "in PromQL, the scorer adds pairs, pp and collectives; no scorer "
                          "needed for them, but several seconds per evaluation at 10,000 "
                          "ranks)", L2_SCORER)
    axes: tuple[str, ...] = _doc("parallel axes (of dp, tp, ep) whose group statistics the "
                                 "rules record for the dashboards; with l2_source promql, the "
                                 "axes whose compute phases the rules compare in groups of 3+ "
                                 "(pp, pairs and collectives are the scorer's): drop the ones "
                                 "whose groups are pairs in your jobs, each costs three passes "
                                 "over every rank's phases", PROMQL_AXES)
    runbook_url: str = _doc("the runbook, one section per alert: each alert's runbook_url is "
                            "this + '#' + its name in lower case. The default is the page's "
                            "path in this repository; point it at where your copy of "
                            "docs/runbook.md is served (a wiki, your Git host)",
                            RUNBOOK_PATH)

    # -- timing -----------------------------------------------------------------------------
    evaluation_interval: float = _duration("evaluation interval of the groups that watch every "
                                           "step (L1 spikes, host stalls, the L1 and L3 "
                                           "alerts)", 15)
    slow_interval: float = _duration("evaluation interval of the groups whose inputs change "
                                     "slowly: L2 group statistics (medians of 32 steps), the "
                                     "regression's medians over minutes, pipeline rates and "
                                     "alerts", 60)
    scrape_interval: float = _duration("scrape interval of the exporters (the local stack's "
                                       "Prometheus uses it)", 15)
    rate_window: float = _duration("window of the per-rank mean step time from counters", 120)
    regression_recent: float = _duration("L1 regression: the recent window (median of the "
                                         "iteration time)", 600)
    regression_baseline: float = _duration("L1 regression: the baseline is the job's best pace "
                                           "(lowest recent-window median) within this long "
                                           "before the recent window, so a lasting slowdown "
                                           "never becomes its own baseline", 6 * 3600)
    spike_history: float = _duration("ArgusIterationSpike: the job's usual slowest-over-median "
                                     "ratio of its rolling window (its own noise) is the "
                                     "median over this long", 1800)
    host_window: float = _duration("ArgusHostStall: window over which a rank's extra host "
                                   "time is summed", 120)
    silent_window: float = _duration("a rank or processor whose series stopped within this "
                                     "long is reported down (remote-write mode has no `up`; "
                                     "older ones are forgotten: a job that shrank). More than "
                                     "Prometheus's 5m lookback plus the `for`; not scaled",
                                     3600, scaled=False)
    scorer_stale_after: float = _duration("the scorer is stale when its last good round is "
                                          "older than this", 300)

    # -- thresholds (defaults are the core's: argus_core.detect L1Config / L2Config) --------
    warmup_steps: int = _doc("first steps of a rank not judged (compilation, warm-up)",
                             _L1.warmup_steps)
    exporter_window_steps: int = _doc("ARGUS_WINDOW_STEPS of the exporters (steps in the "
                                      "rolling-window gauges)", WINDOW_STEPS)
    spike_ratio: float = _doc("L1 spike: the slowest recent step over the rolling median",
                              _L1.spike_ratio)
    min_regression: float = _doc("L1 regression: recent over baseline iteration time",
                                 _L1.min_regression)
    regression_z: float = _doc("L1 regression: the recent median must also exceed the "
                               "baseline by this many robust standard deviations of the job's "
                               "own wander (read from the changes between consecutive recent "
                               "windows). The baseline is the best of ~36 windows and the "
                               "wander heavy-tailed, so a healthy job reaches 4-6", 8.0)
    attribution_share: float = _doc("ArgusHostStall: the rank's extra host time explains at "
                                    "least this share of the job's slowest step's excess",
                                    _L1.attribution_share)
    min_cost_share: float = _doc("the core's cost floor for a verdict, in the per-rank "
                                 "alerts: ArgusHostStall's extra host time costs the job at "
                                 "least this share of the host window, and (l2_source promql) "
                                 "ArgusStragglerRank's excess over its group's median at "
                                 "least this share of the job's step", MIN_COST_SHARE)
    l2_min_ratio: float = _doc("L2: a rank's phase time over its group's median",
                               _L2.min_ratio)
    l2_alpha: float = _doc("L2: expected falsely flagged statistics per job; the z threshold "
                           "is Phi^-1(1 - l2_alpha / N), N = every statistic the job has",
                           _L2.alpha)
    l2_z: float = _doc("L2: the z threshold is never below this (small jobs); z = ln(time / "
                       "group median) / max(1.4826 MAD, l2_scale_floor)", _L2.z_threshold)
    l2_scale_floor: float = _doc("L2: the spread of ln(time / group median) is never taken "
                                 "below this (identical peers)", _L2.scale_floor)
    l2_host_scale_floor: float = _doc("L2: the same for a job whose exporters time phases on "
                                      "the host clock (argus_phase_clock_info{clock=\"host\"})",
                                      _L2.host_scale_floor)
    l2_min_pool: int = _doc("L2: the MAD pooled over an axis's ranks is used from this many "
                            "ranks on", _L2.min_pool)
    processor_reject_ratio: float = _doc("share of records the processor may reject before "
                                         "ArgusProcessorRejectingRecords", 0.01)
    processor_late_ratio: float = _doc("share of kernel events (kind kernels) or of records "
                                       "(steps, stacks) a processor may drop for arriving "
                                       "after their window closed before "
                                       "ArgusProcessorDroppingLate", 0.01)

    # -- for durations ----------------------------------------------------------------------
    for_spike: float = _duration("ArgusIterationSpike", 30)
    for_regression: float = _duration("ArgusIterationRegression", 300)
    for_straggler: float = _duration("ArgusStragglerRank, ArgusRankShortOfCPU and "
                                     "ArgusLinkDegraded", 180)
    for_kernel: float = _duration("ArgusKernelStraggler and ArgusSuspectUnit (scorer rounds "
                                  "are ~1 per minute)",
                                  180)
    for_host: float = _duration("ArgusHostStall (a stall is brief by nature)", 0)
    for_exporter_down: float = _duration("ArgusExporterDown", 300)
    for_component_down: float = _duration("ArgusProcessorDown, ArgusScorerStale and "
                                          "ArgusVectorScrapeFailing", 120)
    for_pipeline: float = _duration("exporter drops, processor rejections, late drops and "
                                    "upload failures", 600)

    # -- Alertmanager example -----------------------------------------------------------------
    group_wait: float = _duration("Alertmanager group_wait", 30)
    group_interval: float = _duration("Alertmanager group_interval", 300)
    repeat_interval: float = _duration("Alertmanager repeat_interval", 4 * 3600)
    webhook_url: str = _doc("where the example receivers post (the local stack fills it in)",
                            "http://127.0.0.1:9095/alerts")
    act_url: str = _doc("where ArgusSuspectUnit also goes: `argus act`'s /webhook, which plans "
                        "drains and tickets (empty: nowhere; the local stack fills it in)",
                        "http://127.0.0.1:9810/webhook")

    def scaled(self, factor: float) -> RulesConfig:
        """The same rules running ``factor`` times faster: every duration divided by it (but
        ``silent_window``: Prometheus's lookback it must exceed does not scale)."""
        if factor <= 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        changes = {f.name: getattr(self, f.name) / factor for f in dataclasses.fields(self)
                   if f.metadata.get("duration") and f.metadata.get("scaled")}
        return dataclasses.replace(self, **changes)

    @property
    def spike_guard(self) -> float:
        """A spike is over once the steps since the previous scrape are back below this ratio
        to the rolling median; a level shift keeps them above (halfway to ``spike_ratio``, so
        a shift near ``spike_ratio`` cannot pass for a spike on jitter alone)."""
        return (1 + self.spike_ratio) / 2

    @property
    def judged_steps(self) -> int:
        """Steps a rank must have done before its rolling window holds no warm-up step."""
        return self.warmup_steps + self.exporter_window_steps


def format_duration(seconds: float) -> str:
    """Prometheus duration text: whole units where possible, else milliseconds (``600ms``)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def load_config(path: str | Path | None) -> RulesConfig:
    """Defaults, overridden by the keys of a YAML file; an unknown key or bad value is an
    error naming it (nothing is silently ignored)."""
    config = RulesConfig()
    if path is None:
        return config
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings at the top level")
    return override(config, data, str(path))


def override(config: RulesConfig, data: dict, origin: str = "config") -> RulesConfig:
    """``config`` with the settings in ``data`` applied (same names as the defaults file)."""
    known = {f.name: f for f in dataclasses.fields(RulesConfig)}
    changes: dict = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"{origin}: unknown setting {key!r} (known: "
                             f"{', '.join(sorted(known))})")
        if key == "selectors":
            changes[key] = _selectors(config.selectors, value, origin)
        elif key == "l2_source":
            if value not in L2_SOURCES:
                raise ValueError(f"{origin}: l2_source: expected one of "
                                 f"{', '.join(L2_SOURCES)}, got {value!r}")
            changes[key] = value
        elif key == "axes":
            axes = tuple(value) if isinstance(value, (list, tuple)) else ()
            if not axes or any(a not in PROMQL_AXES for a in axes):
                raise ValueError(f"{origin}: axes: expected a list of {', '.join(PROMQL_AXES)}"
                                 f" (pp, pairs and collectives are judged by the scorer)")
            changes[key] = axes
        else:
            changes[key] = _value(known[key], value, origin)
    config = dataclasses.replace(config, **changes)
    if config.silent_window <= LOOKBACK_S:
        raise ValueError(f"{origin}: silent_window: must be longer than Prometheus's "
                         f"{format_duration(LOOKBACK_S)} lookback, got "
                         f"{format_duration(config.silent_window)}")
    return config


def _selectors(current: Selectors, value, origin: str) -> Selectors:
    if not isinstance(value, dict):
        raise ValueError(f"{origin}: selectors: expected a mapping")
    names = {f.name for f in dataclasses.fields(Selectors)}
    for key, text in value.items():
        if key not in names:
            raise ValueError(f"{origin}: unknown selector {key!r} (known: "
                             f"{', '.join(sorted(names))})")
        if not isinstance(text, str):
            raise ValueError(f"{origin}: selectors.{key}: expected a string of matchers")
    return dataclasses.replace(current, **value)


def _value(spec: dataclasses.Field, value, origin: str):
    name = spec.name
    if spec.metadata.get("duration"):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{origin}: {name}: {exc}") from None
    default = spec.default
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"{origin}: {name}: expected a string, got {value!r}")
        return value
    kind = type(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{origin}: {name}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{origin}: {name}: expected a whole number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{origin}: {name}: must be a finite number >= 0, got {value!r}")
    return kind(value)


def defaults_yaml() -> str:
    """The commented defaults file: every setting, its default and what it does."""
    lines = ["# Argus: every setting of the generated rules, alerts, Alertmanager routing and",
             "# dashboards, with its default. Generated by `argus generate`; do not edit. Copy",
             "# the keys you change into your own file and run",
             "# `argus generate --config YOURS.yml --out DIR`: rules and dashboards then agree.",
             "# Durations are Prometheus durations. Thresholds default to the core's",
             "# (argus_core.detect: L1Config, L2Config), so the rules judge like",
             "# `argus diagnose`.", ""]
    config = RulesConfig()
    lines.append("selectors:")
    for f in dataclasses.fields(Selectors):
        lines.append(f"  # {f.metadata['doc']}")
        lines.append(f"  {f.name}: {_yaml_scalar(getattr(config.selectors, f.name))}")
    for f in dataclasses.fields(RulesConfig):
        if f.name == "selectors":
            continue
        lines.append(f"# {f.metadata['doc']}")
        lines.append(f"{f.name}: {_shown(f, getattr(config, f.name))}")
    return "\n".join(lines) + "\n"


def _shown(f: dataclasses.Field, value) -> str:
    """A setting's value as the defaults file writes it (durations as ``1m``, axes as a list)."""
    if f.metadata.get("duration"):
        return format_duration(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(value) + "]"
    return _yaml_scalar(value)


def reference_markdown() -> str:
    """The config reference of docs/rules.md: every setting (selectors as ``selectors.NAME``),
    its default as the defaults file writes it, and what it does, from the fields' own docs."""
    config = RulesConfig()
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]

    def row(name: str, shown: str, doc: str) -> None:
        cells = (f"`{name}`", f"`{shown}`", doc)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")

    for f in dataclasses.fields(Selectors):
        row(f"selectors.{f.name}", _yaml_scalar(getattr(config.selectors, f.name)),
            f.metadata["doc"])
    for f in dataclasses.fields(RulesConfig):
        if f.name == "selectors":
            continue
        row(f.name, _shown(f, getattr(config, f.name)), f.metadata["doc"])
    return "\n".join(rows) + "\n"


def _yaml_scalar(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)
