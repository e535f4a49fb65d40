"""promtool unit tests for every alert and the recorded statistics, generated from the config.

Mixin style: each alert is tested with small synthetic series for "nothing yet" one evaluation
before its ``for`` runs out and "firing" right after, with exact labels and annotations; the
recorded group statistics are checked against the same arithmetic done here in Python. The
inputs are built from the config's thresholds and windows, so a user's own config regenerates
tests that still hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.recording import recording_groups
from argus_core.stats.robust import MAD_TO_SIGMA

RULE_FILES = ["../../recording_rules/argus.rules.yml", "../argus.alerts.yml"]
RECORDING_RULE_FILES = ["../argus.rules.yml"]


@dataclass
class Series:
    """One input series: labels and one value per interval (None = no sample)."""

    name: str
    labels: dict[str, str]
    values: list[float | None] = field(default_factory=list)

    def document(self) -> dict:
        """The promtool ``input_series`` entry."""
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        return {"series": f"{self.name}{{{inner}}}", "values": values_text(self.values)}


def values_text(values: list[float | None]) -> str:
    """promtool's value list: runs of one value as ``vxN``, missing samples as ``_``."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        text = "_" if values[i] is None else _num(values[i])
        if j > i and values[i] is not None:
            parts.append(f"{text}x{j - i}")
        else:
            parts.extend([text] * (j - i + 1))
        i = j + 1
    return " ".join(parts)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


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


def group_statistics(values: list[float], config: RulesConfig) -> dict[str, float]:
    """The recorded median, scale and threshold of one group, as the rules compute them."""
    median = quantile(0.5, values)
    mad = quantile(0.5, [abs(v - median) for v in values])
    scale = max(MAD_TO_SIGMA * mad, config.l2_scale_floor * median)
    margin = max(float(f"{config.l2_min_ratio - 1:g}") * median, config.l2_z * scale)
    return {"median": median, "scale": scale, "threshold": median + margin}


def _alert_labels(config: RulesConfig, rule: dict, **labels: str) -> dict[str, str]:
    return {**labels, **rule["labels"]}


def _annotations(rule: dict, **values: str) -> dict[str, str]:
    """The rule's annotations with its templates filled in by hand (exact text)."""
    out = {}
    for key, text in rule["annotations"].items():
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

    rule = _rule(groups, "ArgusHostStall")
    host_s = 0.01
    series = []
    for rank in range(3):
        series += steps.series(rank_labels(config, "stall", rank, dp=rank), host_s=host_s,
                               stall={stall_at: spike_s}, stalled=rank == 2)
    tests.append(_test(config, "ArgusHostStall: the rank whose GPU idled during the spike",
                       series, alerts=[
                           _check(config, stall_at, "ArgusHostStall", []),
                           _check(config, stall_at + 1, "ArgusHostStall", [_expect(
                               _alert_labels(config, rule, **rank_labels(config, "stall", 2, dp=2)),
                               _annotations(rule, **{
                                   "$labels.rank": "2", "$labels.host": "node-0",
                                   "$labels.job": "stall",
                                   "$value | humanizeDuration": _humanize_duration(spike_s)}))]),
                       ]))

    rule = _rule(groups, "ArgusIterationRegression")
    recent = round(config.regression_recent / config.evaluation_interval)
    onset = round(config.regression_baseline / config.evaluation_interval) // 2
    length = onset + recent + _for_intervals(config, config.for_regression) + 2
    base = 2.0
    factor = 1.5
    values = [base] * onset + [base * factor] * (length - onset)
    # The recent median flips once more than half of its window's samples are slow.
    flips = onset + recent // 2
    tests.append(_test(config, "ArgusIterationRegression: recent median over the baseline's",
                       [Series("job:argus_iteration_seconds:max_rate", {"job": "slower"},
                               values)],
                       alerts=_fires(config, "ArgusIterationRegression", flips,
                                     config.for_regression,
                                     [_expect(_alert_labels(config, rule, job="slower"),
                                              _annotations(rule, **{
                                                  "$labels.job": "slower",
                                                  '$value | printf "%.2f"':
                                                  f"{factor:.2f}"}))])))
    return tests


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


def l2_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """A compute straggler in a dp group (its peers wait in the allreduce: not stragglers),
    a slow tp link, and a group within the threshold."""
    onset = 0
    samples = _for_intervals(config, config.for_straggler) + 2
    series: list[Series] = []
    base = 0.125
    slow = base * (config.l2_min_ratio + 1)
    for rank in range(4):
        labels = rank_labels(config, "train", rank, dp=rank)
        mlp = slow if rank == 3 else base
        wait = 0.0 if rank == 3 else slow - base
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "mlp", "stat": "median"}, [mlp] * samples))
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "dp-allreduce", "stat": "median"},
                             [0.0625 + wait] * samples))
    near = base * (1 + (config.l2_min_ratio - 1) / 2)  # halfway to the ratio: no alert
    for rank in range(4):
        labels = rank_labels(config, "fine", rank, dp=rank)
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
    tests = [_test(config, "ArgusStragglerRank: the slow rank, not the ranks waiting for it",
                   series, alerts=_fires(config, "ArgusStragglerRank", onset,
                                         config.for_straggler, [straggler]))]

    series = []
    slow_link = 0.03
    for rank in range(6):
        dp, tp = divmod(rank, 2)
        labels = rank_labels(config, "links", rank, dp=dp, tp=tp)
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "tp-comm", "stat": "median"},
                             [slow_link if dp == 2 else 0.01] * samples))
    rule = _rule(groups, "ArgusLinkDegraded")
    link = [_expect(_alert_labels(config, rule, phase="tp-comm", axis="tp",
                                  **rank_labels(config, "links", rank, dp=2, tp=rank - 4)),
                    _annotations(rule, **{"$labels.rank": str(rank), "$labels.host": "node-0",
                                          "$labels.job": "links", "$labels.axis": "tp",
                                          "$labels.phase": "tp-comm",
                                          '$value | printf "%.2f"': f"{slow_link / 0.01:.2f}"}))
            for rank in (4, 5)]
    tests.append(_test(config, "ArgusLinkDegraded: a tp group slow even for its last arriver",
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


def pipeline_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """Exporter down or dropping, processor down, rejecting or failing uploads, scorer stale."""
    sel = config.selectors
    tests = []
    down_at = 2
    for name, up, for_s in (("ArgusExporterDown", sel.exporters_up, config.for_exporter_down),
                            ("ArgusProcessorDown", sel.processor_up,
                             config.for_component_down)):
        samples = down_at + _for_intervals(config, for_s) + 2
        labels = {**_matchers(up), "instance": "node-0:9400"}
        rule = _rule(groups, name)
        tests.append(_test(config, f"{name}: its target stops answering", [
            Series("up", labels, [1.0] * down_at + [0.0] * (samples - down_at)),
            Series("up", {**labels, "instance": "node-1:9400"}, [1.0] * samples)],
            alerts=_fires(config, name, down_at, for_s, [_expect(
                _alert_labels(config, rule, **labels),
                _annotations(rule, **{"$labels.instance": "node-0:9400"}))])))

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
    tests.append(_test(config, "Pipeline: drops, rejections and upload failures", series,
                       alerts=alerts))

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


def recording_tests(config: RulesConfig) -> list[dict]:
    """Group statistics (median, MAD, scale, threshold) and the L1 ratios, computed here."""
    values = [1.0, 1.0, 1.25, 4.0]
    series = [Series("argus_phase_window_seconds",
                     {**rank_labels(config, "train", r, dp=r), "phase": "mlp", "stat": "median"},
                     [v, v]) for r, v in enumerate(values)]
    stats = group_statistics(values, config)
    group = '{axis="dp",ep="0",job="train",phase="mlp",pp="0",tp="0"}'
    exprs = [{"expr": f'axis_group:argus_phase_seconds:{name}{{axis="dp"}}', "eval_time":
              format_duration(config.evaluation_interval),
              "exp_samples": [{"labels": f"axis_group:argus_phase_seconds:{name}{group}",
                               "value": stats[name]}]}
             for name in ("median", "scale", "threshold")]
    tests = [_test(config, "L2 group statistics of a dp group", series, exprs=exprs)]

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
