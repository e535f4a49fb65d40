"""promtool unit tests for every alert and the recorded statistics, generated from the config.

Mixin style: each alert is tested with small synthetic series for "nothing yet" one evaluation
before its ``for`` runs out and "firing" right after, with exact labels and annotations; the
recorded group statistics are checked against the same arithmetic done here in Python. The
inputs are built from the config's thresholds and windows, so a user's own config regenerates
tests that still hold.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from argus_core.rules.config import L2_PROMQL, LOOKBACK_S, RulesConfig, format_duration
from argus_core.rules.recording import recording_groups
from argus_core.stats.robust import MAD_TO_SIGMA

RULE_FILES = ["../../recording_rules/argus.rules.yml", "../argus.alerts.yml"]
RECORDING_RULE_FILES = ["../argus.rules.yml"]


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
                else _num(values[i]))
        if j > i and values[i] is not None and not isinstance(values[i], str):
            parts.append(f"{text}x{j - i}")
        else:
            parts.extend([text] * (j - i + 1))
        i = j + 1
    return " ".join(parts)


def _num(value: float) -> str:
    """A sample as promtool reads it: 12 significant digits, so that the generated files do
    not change with the last bits of a machine's vectorised exp and log."""
    return str(int(value)) if float(value).is_integer() else repr(float(f"{value:.12g}"))


def rank_labels(config: RulesConfig, job: str, rank: int, dp: int = 0, tp: int = 0,
                pp: int = 0, ep: int = 0, host: str = "node-0") -> dict[str, str]:
    """The exporter's identity labels (exporters/identity.py), plus what the configured
    exporter selector requires."""
    return {**_matchers(config.selectors.exporters), "job": job, "rank": str(rank),
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


def _alert_labels(config: RulesConfig, rule: dict, **labels: str) -> dict[str, str]:
    return {**labels, **rule["labels"]}


_IF = re.compile(r"\{\{ if (\S+) \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}")


def _annotations(rule: dict, **values: str) -> dict[str, str]:
    """The rule's annotations with its templates filled in by hand (exact text); an ``{{ if
    $labels.x }}`` takes its first branch when ``$labels.x`` is given."""
    out = {}
    for key, text in rule["annotations"].items():
        text = _IF.sub(lambda m: m.group(2) if values.get(m.group(1)) else m.group(3), text)
        for name, value in values.items():
            text = text.replace("{{ " + name + " }}", value)
        out[key] = text
    return out


class _Steps:
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


def _rule(groups: list[dict], name: str) -> dict:
    return next(r for g in groups for r in g["rules"] if r.get("alert") == name)


def _t(config: RulesConfig, intervals: int) -> str:
    return format_duration(intervals * config.evaluation_interval)


def _for_intervals(config: RulesConfig, seconds: float) -> int:
    return round(seconds / config.evaluation_interval)


def _test(config: RulesConfig, name: str, series: list[Series], alerts=(), exprs=()) -> dict:
    test = {"name": name, "interval": format_duration(config.evaluation_interval),
            "input_series": [s.document() for s in series]}
    if alerts:
        test["alert_rule_test"] = list(alerts)
    if exprs:
        test["promql_expr_test"] = list(exprs)
    return test


def _check(config: RulesConfig, at: int, alertname: str, alerts: list[dict]) -> dict:
    return {"eval_time": _t(config, at), "alertname": alertname, "exp_alerts": alerts}


def _expect(labels: dict[str, str], annotations: dict[str, str]) -> dict:
    return {"exp_labels": labels, "exp_annotations": annotations}


def _fires(config: RulesConfig, name: str, onset: int, for_s: float, expected: list[dict]):
    """Nothing one evaluation before ``for`` runs out (unless ``for`` is zero: then nothing one
    evaluation before the onset), the expected alerts right after."""
    due = onset + _for_intervals(config, for_s)
    return [_check(config, due - 1, name, []), _check(config, due, name, expected)]


def l1_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """Spike (and a level shift that is not one), regression, host stall."""
    tests = []
    # The stall comes once the host window is full of samples: increase() then needs no
    # extrapolation and the expected excess is exact.
    stall_at = round(config.host_window / config.evaluation_interval) + 2
    samples = stall_at + 10
    steps = _Steps(config, samples)
    # A spike big enough that the interval holding it is slow on average, as a level shift's
    # first interval is: the alert must wait until the steps after it are back to normal.
    spike_s = ((config.spike_ratio - 1) * steps.per + 2.2) * steps.step_s
    series = steps.series(rank_labels(config, "spiky", 0), stall={stall_at: spike_s})
    series += steps.series(rank_labels(config, "spiky", 1, dp=1), stall={stall_at: spike_s})
    series += steps.series(rank_labels(config, "shifted", 0), slow_from=stall_at, factor=4.0)
    series += steps.series(rank_labels(config, "shifted", 1, dp=1), slow_from=stall_at, factor=4.0)
    rule = _rule(groups, "ArgusIterationSpike")
    ratio = (steps.step_s + spike_s) / steps.step_s
    # The interval holding the spike still looks like a level shift (its steps are slow on
    # average); the condition starts one evaluation later.
    tests.append(_test(config, "ArgusIterationSpike: a spike fires; a level shift does not",
                       series, alerts=_fires(
                           config, "ArgusIterationSpike", stall_at + 1, config.for_spike,
                           [_expect(_alert_labels(config, rule, job="spiky"),
                                    _annotations(rule, **{"$labels.job": "spiky",
                                                          '$value | printf "%.1f"':
                                                          f"{ratio:.1f}"}))])))

    tests.append(noisy_spike_test(config, groups, stall_at, samples))
    tests += host_stall_tests(config, groups, stall_at, samples)
    tests.append(regression_test(config, groups))
    tests.append(wander_test(config, groups))
    return tests


def noisy_spike_test(config: RulesConfig, groups: list[dict], stall_at: int,
                     samples: int) -> dict:
    """ArgusIterationSpike on a noisy job: every interval holds a blip of 1.9x (a busy CPU
    job's usual), so its usual window ratio is 1.9 and a spike must reach 1.9^2 = 3.6x. A
    2.6x step is its noise and pages nothing; a 6x step pages, once the job is back to its
    pace."""
    rule = _rule(groups, "ArgusIterationSpike")
    steps = _Steps(config, samples)
    blips = {k: 0.9 * steps.step_s for k in range(1, samples)}
    small = {**blips, stall_at: 1.6 * steps.step_s}
    big_s = 5.0 * steps.step_s
    big = {**blips, stall_at: big_s}
    series = []
    for rank in range(2):
        series += steps.series(rank_labels(config, "noisy-small", rank, dp=rank), stall=small)
        series += steps.series(rank_labels(config, "noisy-big", rank, dp=rank), stall=big)
    ratio = (steps.step_s + big_s) / steps.step_s
    return _test(config, "ArgusIterationSpike on a noisy job: beyond its own noise only",
                 series, alerts=_fires(
                     config, "ArgusIterationSpike", stall_at + 1, config.for_spike,
                     [_expect(_alert_labels(config, rule, job="noisy-big"),
                              _annotations(rule, **{"$labels.job": "noisy-big",
                                                    '$value | printf "%.1f"':
                                                    f"{ratio:.1f}"}))]))


HOST_STEPS_PER_INTERVAL = (1, 4, 25)  # 8, 32 and 200 steps per default host window


def host_stall_tests(config: RulesConfig, groups: list[dict], stall_at: int,
                     samples: int) -> list[dict]:
    """ArgusHostStall at several steps per window: the rank whose GPU idled during a spike
    fires; a healthy rank whose host is 1.5% busier than its peers' on every step (a cost
    under the floor, summed over however many steps fit in the window) never does, even
    when a small compute spike on another rank opens the gate."""
    rule = _rule(groups, "ArgusHostStall")
    host_s = 0.01
    tests = []
    for per in HOST_STEPS_PER_INTERVAL:
        steps = _Steps(config, samples, steps_per_interval=per)
        window_steps = round(config.host_window / config.evaluation_interval) * per
        if window_steps <= config.exporter_window_steps:
            # One stall that slows its interval on average: the alert waits one evaluation
            # for the job to be back to its pace, with the spike still in the gauges' window.
            stall_s = ((config.spike_ratio - 1) * steps.per + 2.2) * steps.step_s
            stalls, fires_at = {stall_at: stall_s}, stall_at + 1
        else:
            # The gauges' window is shorter than an interval: a stall that leaves its
            # interval at pace (so the spike counts at once), twice: one alone costs the job
            # under the floor of the window's time (stall < 2 x floor), two more.
            floor_s = config.min_cost_share * config.host_window
            stall_s = 1.5 * floor_s
            if not ((config.spike_ratio - 1) * steps.step_s <= stall_s
                    < (config.spike_guard - 1) * steps.per * steps.step_s):
                continue  # these settings leave no such stall: nothing to test at this rate
            stalls, fires_at = {stall_at - 1: stall_s, stall_at: stall_s}, stall_at
        stalled, busy = f"stall-{per}", f"busy-host-{per}"
        series = []
        for rank in range(3):
            series += steps.series(rank_labels(config, stalled, rank, dp=rank), host_s=host_s,
                                   stall=stalls, stalled=rank == 2)
        small_spike = (config.spike_ratio - 1 + 0.1) * steps.step_s
        for rank in range(3):
            extra = 0.015 * steps.step_s if rank == 1 else 0.0
            series += steps.series(rank_labels(config, busy, rank, dp=rank),
                                   host_s=host_s + extra, stall={stall_at: small_spike})
        expected = [_expect(
            _alert_labels(config, rule, **rank_labels(config, stalled, 2, dp=2)),
            _annotations(rule, **{"$labels.rank": "2", "$labels.host": "node-0",
                                  "$labels.job": stalled, "$value | humanizeDuration":
                                  _humanize_duration(sum(stalls.values()))}))]
        tests.append(_test(
            config, f"ArgusHostStall at {window_steps} steps per window: the rank whose GPU "
                    f"idled during the spike, never a healthy rank with a busier host",
            series, alerts=[_check(config, fires_at - 1, "ArgusHostStall", []),
                            _check(config, fires_at, "ArgusHostStall", expected)]))
    return tests


def regression_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A slowdown that lasts: the alert fires once the recent median flips and keeps firing
    more than an hour later (a baseline that absorbed the slowdown would let it resolve)."""
    rule = _rule(groups, "ArgusIterationRegression")
    interval = config.evaluation_interval
    recent = round(config.regression_recent / interval)
    # A baseline of full recent windows and two recent windows of the job's wander (the
    # noise the threshold needs) before the onset.
    onset = 4 * recent + 2
    # Longer than an hour (where a median over the hour before had absorbed it), within the
    # baseline window (past it, the slower pace is the job's own).
    lasting = round(min(max(75 * 60, config.regression_recent * 7.5),
                        0.9 * config.regression_baseline) / interval)
    length = onset + lasting + 2
    base, factor = 2.0, 1.5
    values = [base] * onset + [base * factor] * (length - onset)
    # The recent median flips once more than half of its window's samples are slow.
    flips = onset + recent // 2
    expected = [_expect(_alert_labels(config, rule, job="slower"),
                        _annotations(rule, **{"$labels.job": "slower",
                                              '$value | printf "%.2f"': f"{factor:.2f}"}))]
    return _test(config, "ArgusIterationRegression: recent median over the best before, "
                 "still firing after the slowdown lasted",
                 [Series("job:argus_iteration_seconds:max_rate", {"job": "slower"}, values)],
                 alerts=[*_fires(config, "ArgusIterationRegression", flips,
                                 config.for_regression, expected),
                         _check(config, onset + lasting, "ArgusIterationRegression",
                                expected)])


# Medians of one recent window each, in ms, of a healthy 4-rank CPU job on a 2-vCPU VM (no
# stack, file sink): its pace wanders 1.16x from one window to the next.
VM_WANDER_MS = (89.4, 104.1, 99.4, 90.1, 92.3, 94.8, 93.4)


def wander_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A job whose pace wanders as a shared VM's does (levels ``VM_WANDER_MS``, one per recent
    window, and per-sample jitter that only ever slows it) is never paged, over more than an
    hour; the same job's lasting 1.6x slowdown from its best pace is, once it fills the recent
    window. The best level has no jitter and lasts a little longer than a window, so the
    baseline is exactly it."""
    import numpy as np

    rule = _rule(groups, "ArgusIterationRegression")
    recent = round(config.regression_recent / config.evaluation_interval)
    best = min(VM_WANDER_MS)
    lengths = [recent + 4 if level == best else recent for level in VM_WANDER_MS]
    pattern = np.repeat(np.asarray(VM_WANDER_MS) / 1000, lengths)
    jitter = np.exp(np.abs(np.random.default_rng(7).normal(0.0, 0.02, len(pattern))))
    pattern = np.where(pattern == best / 1000, pattern, pattern * jitter)
    onset = 3 * len(pattern)
    length = onset + 3 * recent
    healthy = [float(v) for v in np.resize(pattern, length)]
    factor = 1.6
    slower = healthy[:onset] + [factor * best / 1000] * (length - onset)
    due = onset + recent + _for_intervals(config, config.for_regression) + 1
    expected = [_expect(_alert_labels(config, rule, job="slower"),
                        _annotations(rule, **{"$labels.job": "slower",
                                              '$value | printf "%.2f"': f"{factor:.2f}"}))]
    checks = [_check(config, at, "ArgusIterationRegression", [])
              for at in range(4 * recent, onset + recent // 2, recent // 4)]
    checks += [_check(config, at, "ArgusIterationRegression", expected)
               for at in range(due, length, recent // 4)]
    return _test(config, "ArgusIterationRegression: a job's own wander (1.16x from window to "
                 "window) is not a regression; a lasting 1.6x slowdown on the same job is",
                 [Series("job:argus_iteration_seconds:max_rate", {"job": "wandering"}, healthy),
                  Series("job:argus_iteration_seconds:max_rate", {"job": "slower"}, slower)],
                 alerts=checks)


def _humanize_duration(v: float) -> str:
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


def normal_upper_quantile(p: float) -> float:
    """Phi^-1(1 - p) as the rules compute it (``recording.normal_upper_quantile``)."""
    from argus_core.rules.recording import _ACKLAM_C, _ACKLAM_D

    q = math.sqrt(-2 * math.log(p))

    def horner(coefficients: tuple[float, ...]) -> float:
        value = coefficients[0]
        for c in coefficients[1:]:
            value = value * q + c
        return value

    return -horner(_ACKLAM_C) / horner(_ACKLAM_D)


def l2_margin(config: RulesConfig, tests: int, sigma: float | None = None) -> float:
    """ln of the ratio above a group's median at which the rules flag a rank, for a job
    judging ``tests`` statistics (``sigma``: the pooled spread, the floor when None)."""
    z = max(config.l2_z, normal_upper_quantile(config.l2_alpha / tests))
    return max(math.log(config.l2_min_ratio), z * max(sigma or 0.0, config.l2_scale_floor))


def _scorer_labels(config: RulesConfig, job: str, rank: int, phase: str, axis: str,
                   **coords: int) -> dict[str, str]:
    """The labels of one ``argus_phase_straggler_ratio`` series."""
    ident = rank_labels(config, job, rank, **coords)
    ident = {k: v for k, v in ident.items() if k not in _matchers(config.selectors.exporters)}
    return {**_matchers(config.selectors.scorer), **ident, "phase": phase, "axis": axis}


def l2_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """ArgusStragglerRank from its source (``l2_source``: the scorer's findings, or the
    rules' own comparison), the scorer's pair member, and a collective slow with nobody
    arriving late (ArgusLinkDegraded)."""
    tests = (l2_promql_tests(config, groups) if config.l2_source == L2_PROMQL
             else l2_scorer_tests(config, groups))
    return tests + l2_scorer_finding_tests(config, groups)


def l2_scorer_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """``l2_source: scorer``: the scorer's compute finding fires with its labels after
    ``for`` (its collective finding does not: that is ArgusLinkDegraded's); a healthy job's
    phases, however uneven, raise nothing without a finding; and a scorer that goes stale
    raises ArgusScorerStale and no L2 alert (nothing stale is judged)."""
    rule = _rule(groups, "ArgusStragglerRank")
    samples = _for_intervals(config, config.for_straggler) + 2
    straggler = _scorer_labels(config, "train", 3, "mlp", "dp", dp=3)
    waiter = _scorer_labels(config, "train", 0, "dp-allreduce", "dp", dp=0)
    series = [Series("argus_phase_straggler_ratio", {**straggler, "kind": "compute"},
                     [1.5] * samples),
              Series("argus_phase_straggler_ratio", {**waiter, "kind": "communication"},
                     [2.0] * samples)]
    expected = _expect(_alert_labels(config, rule, **straggler), _annotations(rule, **{
        "$labels.rank": "3", "$labels.host": "node-0", "$labels.job": "train",
        "$labels.axis": "dp", "$labels.phase": "mlp", '$value | printf "%.2f"': "1.50"}))
    tests = [_test(config, "ArgusStragglerRank: the scorer's finding, after `for`", series,
                   alerts=_fires(config, "ArgusStragglerRank", 0, config.for_straggler,
                                 [expected]))]

    # A healthy job: the scorer publishes its statistics and no finding; a rank 3x its
    # group in the exporters' phases alone (no scorer finding) is not the alerts' business.
    series = []
    for rank in range(4):
        labels = rank_labels(config, "healthy", rank, dp=rank)
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "mlp", "stat": "median"},
                             [0.375 if rank == 3 else 0.125] * samples))
    series.append(Series("argus_l2_group_median_seconds",
                         {**_matchers(config.selectors.scorer), "job": "healthy",
                          "axis": "dp", "phase": "mlp", "tp": "0", "pp": "0", "ep": "0"},
                         [0.125] * samples))
    series.append(Series("argus_scorer_l2_tests", {**_matchers(config.selectors.scorer),
                                                    "job": "healthy"}, [4.0] * samples))
    tests.append(_test(config, "ArgusStragglerRank: nothing without a scorer finding",
                       series, alerts=[_check(config, k, "ArgusStragglerRank", [])
                                       for k in (samples // 2, samples - 1)]))

    # The scorer goes stale mid-incident: its scrape fails (up 0, staleness markers on its
    # series); the L2 alert goes with its finding and ArgusScorerStale takes over.
    stale_rule = _rule(groups, "ArgusScorerStale")
    due = _for_intervals(config, config.for_straggler)
    dies = due + 2
    down = _for_intervals(config, config.for_component_down)
    samples = dies + down + 3
    scorer = {**_matchers(config.selectors.scorer_up), **_matchers(config.selectors.scorer),
              "instance": "node-0:9800"}
    success = [k * config.evaluation_interval for k in range(dies)]
    series = [
        Series("argus_phase_straggler_ratio", {**straggler, "kind": "compute"},
               [1.5] * dies + ["stale"] * (samples - dies)),
        Series("argus_scorer_last_success_timestamp_seconds", scorer,
               success + ["stale"] * (samples - dies)),
        Series("up", scorer, [1.0] * dies + [0.0] * (samples - dies))]
    stale = _expect(_alert_labels(config, stale_rule, **scorer),  # `up == 0`'s labels
                    _annotations(stale_rule, **{"$labels.instance": "node-0:9800"}))
    tests.append(_test(config, "ArgusScorerStale, and no L2 alert, when the scorer stops",
                       series, alerts=[
                           _check(config, due, "ArgusStragglerRank", [expected]),
                           _check(config, dies, "ArgusStragglerRank", []),
                           _check(config, samples - 1, "ArgusStragglerRank", []),
                           *_fires(config, "ArgusScorerStale", dies,
                                   config.for_component_down, [stale])]))
    return tests


def l2_promql_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """``l2_source: promql``: the rules' comparison (a compute straggler in a dp group of
    four; its peers' waiting in the all-reduce is not slowness; a rank halfway to the
    threshold raises nothing; the same straggler in a job whose step is so long that its
    excess costs less than ``min_cost_share`` of it raises nothing either)."""
    onset = 0
    samples = _for_intervals(config, config.for_straggler) + 2
    series: list[Series] = []
    base = 0.125
    # dp group of four: 4 mlp statistics and 4 dp-allreduce ones; nothing on other axes.
    margin = l2_margin(config, tests=8)
    slow = base * math.exp(margin) * 1.5
    # The job's step (its slowest rank's median): the excess costs 20x the floor in "train"
    # and half of it in "cheap".
    costly_step = (slow - base) / (20 * config.min_cost_share)
    for job, step_s in (("train", costly_step), ("cheap", 40 * costly_step)):
        for rank in range(4):
            labels = rank_labels(config, job, rank, dp=rank)
            mlp = slow if rank == 3 else base
            wait = 0.0 if rank == 3 else slow - base
            series.append(Series("argus_steps_total", labels,
                                 [100.0 + k for k in range(samples)]))
            series.append(Series("argus_step_window_seconds", {**labels, "stat": "median"},
                                 [step_s] * samples))
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": "mlp", "stat": "median"}, [mlp] * samples))
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": "dp-allreduce", "stat": "median"},
                                 [0.0625 + wait] * samples))
    near = base * math.exp(l2_margin(config, tests=4) / 2)  # halfway: no alert
    for rank in range(4):
        labels = rank_labels(config, "fine", rank, dp=rank)
        series.append(Series("argus_steps_total", labels, [100.0 + k for k in range(samples)]))
        series.append(Series("argus_step_window_seconds", {**labels, "stat": "median"},
                             [costly_step] * samples))
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "mlp", "stat": "median"},
                             [near if rank == 3 else base] * samples))
    rule = _rule(groups, "ArgusStragglerRank")
    labels = rank_labels(config, "train", 3, dp=3)
    straggler = _expect(
        _alert_labels(config, rule, **labels, phase="mlp", axis="dp"),
        _annotations(rule, **{"$labels.rank": "3", "$labels.host": "node-0",
                              "$labels.job": "train", "$labels.axis": "dp",
                              "$labels.phase": "mlp",
                              '$value | printf "%.2f"': f"{slow / base:.2f}"}))
    return [_test(config, "ArgusStragglerRank: the slow rank, not the ranks waiting for it, "
                  "and only where its excess costs the job", series,
                  alerts=_fires(config, "ArgusStragglerRank", onset, config.for_straggler,
                                [straggler]))]


def l2_scorer_finding_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """The scorer's findings in either mode: a pair member (ArgusStragglerRank) and a
    collective slow with nobody arriving late (ArgusLinkDegraded)."""
    onset = 0
    samples = _for_intervals(config, config.for_straggler) + 2
    rule = _rule(groups, "ArgusStragglerRank")
    tests = []
    pair = _scorer_labels(config, "pairs", 1, "mlp", "tp", tp=1)
    series = [Series("argus_phase_straggler_ratio", {**pair, "kind": "compute"},
                     [2.0] * samples)]
    tests.append(_test(config, "ArgusStragglerRank: the scorer's pair member", series,
                       alerts=_fires(config, "ArgusStragglerRank", onset,
                                     config.for_straggler, [_expect(
                                         _alert_labels(config, rule, **pair),
                                         _annotations(rule, **{
                                             "$labels.rank": "1", "$labels.host": "node-0",
                                             "$labels.job": "pairs", "$labels.axis": "tp",
                                             "$labels.phase": "mlp",
                                             '$value | printf "%.2f"': "2.00"}))])))

    rule = _rule(groups, "ArgusLinkDegraded")
    series, link = [], []
    for rank in range(6):
        dp, tp = divmod(rank, 2)
        labels = _scorer_labels(config, "links", rank, "tp-comm", "tp", dp=dp, tp=tp)
        if dp == 2:
            series.append(Series("argus_phase_straggler_ratio",
                                 {**labels, "kind": "communication"}, [3.0] * samples))
            link.append(_expect(_alert_labels(config, rule, **labels), _annotations(rule, **{
                "$labels.rank": str(rank), "$labels.host": "node-0",
                "$labels.job": "links", "$labels.axis": "tp", "$labels.phase": "tp-comm",
                '$value | printf "%.2f"': "3.00"})))
    series.append(Series("argus_phase_straggler_ratio",  # a compute finding: not a link
                         {**_scorer_labels(config, "links", 0, "mlp", "tp"), "kind": "compute"},
                         [2.0] * samples))
    tests.append(_test(config, "ArgusLinkDegraded: the scorer's slow collective transfer",
                       series, alerts=_fires(config, "ArgusLinkDegraded", onset,
                                             config.for_straggler, link)))
    return tests


def l3_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """The scorer's flag, with its score in the description."""
    samples = _for_intervals(config, config.for_kernel) + 2
    series = []
    for rank, score in ((4, 0.05), (5, 0.75)):
        labels = {**_matchers(config.selectors.scorer), "job": "train", "rank": str(rank),
                  "kernel": "sm90_gemm", "stream": "7"}
        series.append(Series("argus_kernel_w1_score", labels, [score] * samples))
        series.append(Series("argus_kernel_straggler", labels,
                             [1.0 if rank == 5 else 0.0] * samples))
    rule = _rule(groups, "ArgusKernelStraggler")
    expected = _expect(
        _alert_labels(config, rule, **_matchers(config.selectors.scorer), job="train", rank="5",
                      kernel="sm90_gemm", stream="7"),
        _annotations(rule, **{"$labels.kernel": "sm90_gemm", "$labels.stream": "7",
                              "$labels.rank": "5", "$labels.job": "train",
                              "$value | humanizePercentage": "75%"}))
    return [_test(config, "ArgusKernelStraggler: flagged kernels only", series,
                  alerts=_fires(config, "ArgusKernelStraggler", 0, config.for_kernel,
                                [expected]))]


def _matchers(text: str) -> dict[str, str]:
    """'job="x",a="b"' -> {"job": "x", "a": "b"}: labels that satisfy a selector of equality
    matchers (tests are generated for those; a regex selector needs hand-made series)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if value.startswith(("~", "=")) or key.endswith("!"):
            raise ValueError(f"selector {text!r}: generated tests need equality matchers")
        out[key.strip()] = value.strip().strip('"')
    return out


def down_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """ArgusExporterDown and ArgusProcessorDown in both modes: Prometheus scraping the
    targets (``up`` goes to 0 and their series get staleness markers: one alert per target,
    not one more per rank) and Vector remote-writing them (no ``up``; the series just stop:
    an alert per silent rank of a job that still runs, per silent processor)."""
    sel = config.selectors
    tests = []
    down_at = 2
    lookback = math.ceil(LOOKBACK_S / config.evaluation_interval)
    for mode in ("scrape", "remote write"):
        scraped = mode == "scrape"
        stop = (lambda n: ["stale"] * n) if scraped else (lambda n: [None] * n)
        # Exporters: ranks 0-2 of job "train" on node-0 (rank 2 stops) and node-1.
        onset = down_at if scraped else down_at + lookback
        for_s = config.for_exporter_down
        samples = onset + _for_intervals(config, for_s) + 2
        rule = _rule(groups, "ArgusExporterDown")
        series, expected = [], []
        for rank in range(3):
            instance = f"node-{rank // 2}:9400"
            labels = {**rank_labels(config, "train", rank, host=f"node-{rank // 2}"),
                      "instance": instance}
            running = [100.0 + k for k in range(samples)]
            values = running[:down_at] + stop(samples - down_at) if rank == 2 else running
            series.append(Series("argus_steps_total", labels, values))
        if scraped:
            up = {**_matchers(sel.exporters_up), "instance": "node-1:9400"}
            series += [Series("up", up, [1.0] * down_at + [0.0] * (samples - down_at)),
                       Series("up", {**up, "instance": "node-0:9400"}, [1.0] * samples)]
            expected.append(_expect(_alert_labels(config, rule, **up), _annotations(
                rule, **{"$labels.instance": "node-1:9400"})))
        else:
            silent = {k: v for k, v in rank_labels(config, "train", 2, host="node-1").items()
                      if k in ("job", "rank", "host")}
            expected.append(_expect(_alert_labels(config, rule, **silent,
                                                  instance="node-1:9400"),
                                    _annotations(rule, **{"$labels.rank": "2",
                                                          "$labels.host": "node-1",
                                                          "$labels.job": "train"})))
        tests.append(_test(config, f"ArgusExporterDown ({mode}): one rank's exporter stops",
                           series, alerts=_fires(config, "ArgusExporterDown", onset, for_s,
                                                 expected)))
        if not scraped:  # a rank silent for longer than `silent_window` is forgotten
            fired = onset + _for_intervals(config, for_s) + 1
            forgotten = down_at + math.ceil(config.silent_window / config.evaluation_interval)
            total = forgotten + 2
            series = [Series(s.name, s.labels, s.values[:down_at] + stop(total - down_at)
                             if rank == 2 else [100.0 + k for k in range(total)])
                      for rank, s in enumerate(series)]  # the three ranks above
            tests.append(_test(
                config, "ArgusExporterDown (remote write): forgotten after silent_window",
                series, alerts=[_check(config, fired, "ArgusExporterDown", expected),
                                _check(config, total - 1, "ArgusExporterDown", [])]))
        # A finished job (every rank stops) is not an exporter failure.
        series = [Series("argus_steps_total", rank_labels(config, "done", rank),
                         [100.0, 101.0, *stop(samples - 2)]) for rank in range(2)]
        tests.append(_test(config, f"ArgusExporterDown ({mode}): a finished job is not down",
                           series, alerts=[_check(config, samples - 1, "ArgusExporterDown",
                                                  [])]))

        for_s = config.for_component_down
        samples = onset + _for_intervals(config, for_s) + 2
        rule = _rule(groups, "ArgusProcessorDown")
        series = []
        for node in range(2):
            labels = {**_matchers(sel.processor), "instance": f"node-{node}:9700"}
            running = [10.0 * k for k in range(samples)]
            values = running[:down_at] + stop(samples - down_at) if node == 1 else running
            series.append(Series("argus_processor_records_total", labels, values))
            if scraped:
                up = {**_matchers(sel.processor_up), "instance": f"node-{node}:9700"}
                series.append(Series("up", up, [1.0] * samples if node == 0 else
                                     [1.0] * down_at + [0.0] * (samples - down_at)))
        labels = ({**_matchers(sel.processor_up), "instance": "node-1:9700"} if scraped
                  else {"instance": "node-1:9700"})
        tests.append(_test(config, f"ArgusProcessorDown ({mode}): a processor stops", series,
                           alerts=_fires(config, "ArgusProcessorDown", onset, for_s, [_expect(
                               _alert_labels(config, rule, **labels),
                               _annotations(rule, **{"$labels.instance": "node-1:9700"}))])))

    rule = _rule(groups, "ArgusVectorScrapeFailing")
    start = 2
    window = round(max(config.rate_window, 4 * config.scrape_interval)
                   / config.evaluation_interval)
    samples = start + window + _for_intervals(config, config.for_component_down) + 4
    errors = {**_matchers(sel.vector_scrape), "host": "node-1", "error_type": "request_failed"}
    per = config.evaluation_interval
    tests.append(_test(config, "ArgusVectorScrapeFailing: Vector's scrapes fail", [
        Series("vector_component_errors_total", errors,
               [0.0] * start + [0.5 * per * (k + 1) for k in range(samples - start)]),
        Series("vector_component_errors_total", {**errors, "host": "node-0"}, [3.0] * samples)],
        alerts=_fires(config, "ArgusVectorScrapeFailing", start, config.for_component_down,
                      [_expect(_alert_labels(config, rule, host="node-1"),
                               _annotations(rule, **{"$labels.host": "node-1",
                                                     "$value | humanize": "500m"}))])))
    return tests


def pipeline_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """Exporter down or dropping, processor down, rejecting, dropping late records or failing
    uploads, scorer stale."""
    sel = config.selectors
    tests = []
    tests += down_tests(config, groups)
    # Counters that start moving at `start`: the rate windows see them one interval later.
    start = 2
    window_intervals = round(max(config.rate_window, 4 * config.scrape_interval)
                             / config.evaluation_interval)
    samples = start + window_intervals + _for_intervals(config, config.for_pipeline) + 4
    per = config.evaluation_interval

    def counter(rate: float) -> list[float]:
        return [0.0] * start + [rate * per * (k + 1) for k in range(samples - start)]

    processor = {**_matchers(sel.processor_up), **_matchers(sel.processor),
                 "instance": "node-0:9700"}
    series = [
        Series("argus_exporter_dropped_records_total",
               {**rank_labels(config, "train", 0), "reason": "queue_full"}, counter(2.0)),
        Series("argus_processor_records_total", processor, counter(98.0)),
        Series("argus_processor_rejected_records_total", {**processor, "reason": "field"},
               counter(2.0)),
        Series("argus_processor_upload_failures_total", processor, counter(0.5)),
        # Late drops: 2% of the kernel events and of the records (steps) fire, 0.5% (stacks)
        # stays under processor_late_ratio.
        Series("argus_processor_kernel_events_total", processor, counter(100.0)),
        Series("argus_processor_late_total", {**processor, "kind": "kernels"}, counter(2.0)),
        Series("argus_processor_late_total", {**processor, "kind": "steps"}, counter(1.96)),
        Series("argus_processor_late_total", {**processor, "kind": "stacks"}, counter(0.49)),
    ]
    expected = {
        "ArgusExporterDroppingRecords": ({"job": "train", "reason": "queue_full"},
                                         {"$labels.job": "train", "$labels.reason": "queue_full",
                                          "$value | humanize": "2"}),
        "ArgusProcessorRejectingRecords": ({"instance": "node-0:9700"},
                                           {"$labels.instance": "node-0:9700",
                                            "$value | humanizePercentage": "2%"}),
        "ArgusProcessorUploadFailing": ({"instance": "node-0:9700"},
                                        {"$labels.instance": "node-0:9700",
                                         "$value | humanize": "500m"}),
    }
    alerts = []
    for name, (labels, values) in expected.items():
        rule = _rule(groups, name)
        alerts += _fires(config, name, start, config.for_pipeline, [
            _expect(_alert_labels(config, rule, **labels), _annotations(rule, **values))])
    rule = _rule(groups, "ArgusProcessorDroppingLate")
    alerts += _fires(config, "ArgusProcessorDroppingLate", start, config.for_pipeline, [
        _expect(_alert_labels(config, rule, instance="node-0:9700", kind=kind),
                _annotations(rule, **{"$labels.instance": "node-0:9700", "$labels.kind": kind,
                                      "$value | humanizePercentage": "2%"}))
        for kind in ("kernels", "steps")])
    tests.append(_test(config, "Pipeline: drops, rejections, late drops and upload failures",
                       series, alerts=alerts))

    rule = _rule(groups, "ArgusScorerStale")
    last = 4
    stale = round(config.scorer_stale_after / config.evaluation_interval)
    samples = last + stale + _for_intervals(config, config.for_component_down) + 3
    scorer = {**_matchers(sel.scorer_up), **_matchers(sel.scorer), "instance": "node-0:9800"}
    success = [k * per for k in range(last + 1)] + [last * per] * (samples - last - 1)
    # Fresh until `last`, then the age passes scorer_stale_after one interval after
    # last + stale (strictly greater).
    tests.append(_test(config, "ArgusScorerStale: no good round for too long", [
        Series("argus_scorer_last_success_timestamp_seconds", scorer, success),
        Series("up", scorer, [1.0] * samples)],
        alerts=_fires(config, "ArgusScorerStale", last + stale + 1, config.for_component_down,
                      [_expect(_alert_labels(config, rule, instance="node-0:9800"),
                               _annotations(rule, **{"$labels.instance": "node-0:9800"}))])))
    return tests


def l2_statistics(config: RulesConfig, coords, phases: list[str], values) -> dict:
    """What the L2 rules record for one job's per-rank phase medians, computed here the way
    the rules compute it, and N and z as the core's own L2 counts them."""
    import numpy as np

    from argus_core.detect.l2 import L2Config, detect_l2
    from argus_core.detect.steps import StepMatrix
    from argus_core.schema import AXES
    from argus_core.taxonomy import is_comm_phase
    from argus_core.topology import axis_groups

    n = len(coords)
    zero = np.zeros(1, dtype=np.int64)
    matrix = StepMatrix(np.arange(n), zero, zero, np.full((n, 1), np.nan),
                        np.full((n, 1), np.nan), values[:, None, :], phases)
    core = detect_l2(matrix, coords, np.ones(1, dtype=bool), L2Config(
        min_ratio=config.l2_min_ratio, alpha=config.l2_alpha, z_threshold=config.l2_z,
        scale_floor=config.l2_scale_floor, min_pool=config.l2_min_pool))
    out: dict = {"tests": core.tests, "z": core.z_family, "groups": {}, "scale": {}}
    for axis in config.axes:
        gid = axis_groups(coords, axis)
        sizes = np.bincount(gid)
        pooled = sizes[gid] >= 3
        for c, phase in enumerate(phases):
            if is_comm_phase(phase):
                continue
            deviations = []
            for g in np.flatnonzero(sizes >= 3).tolist():
                members = np.flatnonzero(gid == g)
                median = quantile(0.5, values[members, c].tolist())
                key = (axis, phase, tuple(int(x) for x in coords[members[0]]))
                out["groups"][key] = median
                deviations += [abs(math.log(v / median)) for v in values[members, c]]
            if not deviations:
                continue
            mad = (MAD_TO_SIGMA * quantile(0.5, deviations)
                   if pooled.sum() >= config.l2_min_pool else 0.0)
            out["scale"][(axis, phase)] = max(mad, config.l2_scale_floor)
    for (axis, phase, _), median in list(out["groups"].items()):
        margin = max(math.log(config.l2_min_ratio), out["z"] * out["scale"][(axis, phase)])
        out.setdefault("threshold", {})[(axis, phase, _)] = median * math.exp(margin)
    out["axes"] = AXES
    return out


def _close(expr: str, labels: str, value: float, eval_time: str, tolerance: float = 1e-9):
    """A promql_expr_test that ``expr`` (one series) is within ``tolerance`` (relative) of
    ``value``: Go's and C's ln and exp may differ in the last bit, and so may numpy's on
    different CPUs, so the committed value is rounded to 11 significant digits."""
    value = float(f"{value:.11g}")
    return {"expr": f"abs({expr} - {value!r}) <= bool {float(f'{abs(value) * tolerance:.3g}')!r}",
            "eval_time": eval_time, "exp_samples": [{"labels": labels, "value": 1}]}


def recording_tests(config: RulesConfig) -> list[dict]:
    """L2 statistics of a 32-rank job (dp=8 x tp=4) against the same arithmetic done here
    and the family-wise N and z against the core's own L2 on the same medians; the L1
    ratios."""
    import numpy as np

    from argus_core.schema import AXES

    rng = np.random.default_rng(12)
    coords = np.array([(r // 4, r % 4, 0, 0) for r in range(32)], dtype=np.int64)
    phases = ["attention", "mlp", "tp-comm", "dp-allreduce"]
    base = np.array([0.02, 0.05, 0.004, 0.012])
    values = np.round(base * np.exp(rng.normal(0.0, 0.04, (32, len(phases)))), 6)
    values[13, 1] *= 3  # a straggler: the spread is pooled over the healthy majority
    stats = l2_statistics(config, coords, phases, values)
    if config.l2_source != L2_PROMQL:
        return [scorer_statistics_test(config, coords, phases, values, stats),
                *l1_recording_tests(config)]
    series = []
    for r in range(32):
        labels = rank_labels(config, "train", r, **dict(zip(AXES, coords[r].tolist(),
                                                            strict=True)))
        series.append(Series("argus_steps_total", labels, [100.0, 104.0]))
        for c, phase in enumerate(phases):
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": phase, "stat": "median"},
                                 [float(values[r, c])] * 2))
    # A scorer runs beside the promql rules and disagrees (twice every group statistic): the
    # dashboards' group_statistic must still read the rules' own series.
    from argus_core.rules.recording import GROUP_STATISTICS, group_statistic

    published = scorer_published(coords, phases, values)
    scrape = {**_matchers(config.selectors.scorer), "instance": "node-0:9800"}
    series += [Series(name, {**scrape, **labels}, [2 * value] * 2)
               for _, name in GROUP_STATISTICS.values()
               for labels, value in published.get(name, [])]
    at = format_duration(config.evaluation_interval)
    exprs = [{"expr": "job:argus_l2_tests:count", "eval_time": at, "exp_samples": [
        {"labels": 'job:argus_l2_tests:count{job="train"}', "value": stats["tests"]}]},
        _close("job:argus_l2_z:family", '{job="train"}', stats["z"], at, 1e-7)]
    for (axis, phase), scale in sorted(stats["scale"].items()):
        exprs.append(_close(f'job_phase:argus_phase_log_ratio:scale{{axis="{axis}",'
                            f'phase="{phase}"}}',
                            f'{{axis="{axis}",job="train",phase="{phase}"}}', scale, at))
    for name in ("groups", "threshold"):
        record = "median" if name == "groups" else "threshold"
        for (axis, phase, group), value in sorted(stats[name].items())[::5]:
            others = {a: str(v) for a, v in zip(AXES, group, strict=True) if a != axis}
            selector = ",".join(f'{k}="{v}"' for k, v in {"axis": axis, "phase": phase,
                                                          **others}.items())
            labels = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(
                {"axis": axis, "job": "train", "phase": phase, **others}.items())) + "}"
            exprs.append(_close(f"axis_group:argus_phase_seconds:{record}{{{selector}}}",
                                labels, value, at))
            exprs.append(_close(group_statistic(record, f'job="train",{selector}'),
                                labels, value, at))
    return [_test(config, "L2 statistics of a dp=8 x tp=4 job (N and z as the core counts)",
                  series, exprs=exprs), *l1_recording_tests(config)]


def scorer_published(coords, phases: list[str], values, job: str = "train") -> dict:
    """What the scorer's /metrics serves for one job's phase medians (its own ``judge`` and
    collector): metric name -> [(labels, value)]."""
    import numpy as np

    from argus_core.score.core_adapter import judge
    from argus_core.score.service import Published, ScoreConfig, Scorer
    from argus_core.score.snapshot import JobSnapshot, PhaseTable
    from argus_core.simulate.summaries import synthetic_summaries

    n = len(coords)
    table = PhaseTable(np.arange(n), list(phases), values, np.asarray(coords),
                       None, ["node-0"] * n)
    summary = synthetic_summaries(0, 0)  # L2 only: no kernels
    scorer = Scorer(ScoreConfig(prometheus="http://127.0.0.1:9090"))
    scorer.published = Published(judgements={job: judge(JobSnapshot(job, summary, {}, table))})
    out: dict = {}
    for family in scorer.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def scorer_statistics_test(config: RulesConfig, coords, phases: list[str], values,
                           stats: dict) -> dict:
    """``l2_source: scorer``: the scorer's L2 statistics for the dp=8 x tp=4 job (its own
    code on the same medians) come out of the rules under the ``promql`` mode's names and
    with exactly its labels, whatever extra labels the scrape adds; the groups' medians and
    thresholds (the groups ``l2_statistics`` lists) are not re-recorded, and the dashboards'
    ``group_statistic`` reads them from the scorer with those same labels."""
    from argus_core.rules.recording import GROUP_STATISTICS, SCORER_L2, group_statistic
    from argus_core.schema import AXES

    published = scorer_published(coords, phases, values)
    scrape = {**_matchers(config.selectors.scorer), "instance": "node-0:9800"}
    names = [name for _, name, _ in SCORER_L2] + [p for _, p in GROUP_STATISTICS.values()]
    series = [Series(name, {**scrape, **labels}, [value] * 2)
              for name in names for labels, value in published.get(name, [])]
    source = {record: name for record, name, _ in SCORER_L2}
    source.update(GROUP_STATISTICS.values())

    def value_of(record: str, **labels: str) -> float:
        wanted = {"job": "train", **labels}
        hits = [v for lab, v in published.get(source[record], []) if lab == wanted]
        if len(hits) != 1:
            raise ValueError(f"the scorer publishes {len(hits)} {source[record]} for {wanted}")
        return hits[0]

    at = format_duration(config.evaluation_interval)
    exprs = [{"expr": "job:argus_l2_tests:count", "eval_time": at, "exp_samples": [
        {"labels": 'job:argus_l2_tests:count{job="train"}', "value": stats["tests"]}]},
        _close("job:argus_l2_z:family", '{job="train"}', value_of("job:argus_l2_z:family"),
               at)]
    for axis, phase in sorted(stats["scale"]):
        exprs.append(_close(f'job_phase:argus_phase_log_ratio:scale{{axis="{axis}",'
                            f'phase="{phase}"}}',
                            f'{{axis="{axis}",job="train",phase="{phase}"}}',
                            value_of("job_phase:argus_phase_log_ratio:scale", axis=axis,
                                     phase=phase), at))
    for record, (name, _) in GROUP_STATISTICS.items():
        for axis, phase, group in sorted(stats["groups"]):
            others = {a: str(v) for a, v in zip(AXES, group, strict=True) if a != axis}
            selector = ",".join(f'{k}="{v}"' for k, v in {"job": "train", "axis": axis,
                                                          "phase": phase, **others}.items())
            labels = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(
                {"axis": axis, "job": "train", "phase": phase, **others}.items())) + "}"
            exprs.append(_close(group_statistic(record, selector), labels,
                                value_of(name, axis=axis, phase=phase, **others), at))
        # ... and nothing else: one series per group the promql mode would record,
        axes = f'axis=~"{"|".join(config.axes)}"'
        count = len([k for k in stats["groups"] if k[0] in config.axes])
        exprs.append({"expr": f"count({group_statistic(record, axes)})",
                      "eval_time": at, "exp_samples": [{"labels": "{}", "value": count}]})
        # ... none of them recorded again.
        exprs.append({"expr": name, "eval_time": at, "exp_samples": []})
    return _test(config, "L2 statistics of a dp=8 x tp=4 job: the scorer's (the core's), "
                 "under the names and labels the dashboards read", series, exprs=exprs)


def l1_recording_tests(config: RulesConfig) -> list[dict]:
    """The L1 spike ratio, and warm-up excluded."""
    tests = []
    steps = _Steps(config, 10)
    spike = 3 * steps.step_s
    series = steps.series(rank_labels(config, "spiky", 0), stall={5: spike})
    at = format_duration(6 * config.evaluation_interval)
    tests.append(_test(config, "L1 spike ratio: slowest step over the rolling median", series,
                       exprs=[{"expr": "job:argus_iteration_spike:ratio", "eval_time": at,
                               "exp_samples": [{
                                   "labels": 'job:argus_iteration_spike:ratio{job="spiky"}',
                                   "value": (steps.step_s + spike) / steps.step_s}]}]))
    young = _Steps(config, 4, start_steps=0)
    tests.append(_test(config, "L1 spike ratio: not judged during warm-up",
                       young.series(rank_labels(config, "young", 0), stall={2: spike}),
                       exprs=[{"expr": "job:argus_iteration_spike:ratio",
                               "eval_time": _t(config, 3), "exp_samples": []}]))
    return tests


def unit_test_files(config: RulesConfig) -> dict[str, dict]:
    """Relative path -> promtool test document."""
    from argus_core.rules.alerts import alert_groups

    groups = alert_groups(config)
    interval = format_duration(config.evaluation_interval)
    recording = [g["name"] for g in recording_groups(config)]
    # Recording groups first: alerts then read this evaluation's recorded series (Prometheus
    # runs groups independently, so live they may read the previous evaluation's).
    order = [*recording, *(g["name"] for g in groups)]

    def document(rule_files: list[str], tests: list[dict]) -> dict:
        return {"rule_files": rule_files, "evaluation_interval": interval,
                "group_eval_order": order if len(rule_files) > 1 else recording,
                "tests": tests}

    return {
        "alerting/tests/l1.test.yml": document(RULE_FILES, l1_tests(config, groups)),
        "alerting/tests/l2.test.yml": document(RULE_FILES, l2_tests(config, groups)),
        "alerting/tests/l3.test.yml": document(RULE_FILES, l3_tests(config, groups)),
        "alerting/tests/pipeline.test.yml": document(RULE_FILES,
                                                     pipeline_tests(config, groups)),
        "recording_rules/tests/statistics.test.yml": document(RECORDING_RULE_FILES,
                                                              recording_tests(config)),
    }
