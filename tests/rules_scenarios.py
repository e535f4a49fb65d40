"""promtool tests generated from simulator scenarios, with the core's verdicts as expectations.

A scenario is one simulated job. Its records go two ways: through the core (``diagnose``), and
through the exporters' own metrics code (``StepMetrics``, sampled at every evaluation as a
scrape would see it) into a promtool test file whose input series are those samples, plus the
scorer's L2 series (``argus_phase_straggler_ratio``: the scorer's own code, ``judge_phases``
and ``beyond_promql``, run on those samples at every scorer round, as it would read them from
Prometheus). The test's expectations are the core's L1/L2 findings, written as "these alerts
fired at some point, for exactly these jobs, ranks and phases". ``promtool test rules``
passing means the rules and the scorer agree with the core on that data; a failure prints
both sides.

The core judges the records the exporters' metrics are made of (rank and step records), not
the kernels: their start times tell ``argus diagnose`` whether a rank's host time (wall - GPU)
came before its step (a stall its peers wait for) or after it (slack, having finished early),
and no metric carries that. Where it decides (a link slow for one rank only, its peers idle
after the step: ``link:...:local=1``), the alerts see what the core sees without kernels: a
rank waiting in its collective, and only ``argus diagnose`` on the trace finds the link.

Simulated steps last ~0.16 s while production assumes a 15 s scrape over steps of a few
seconds; the rules are therefore run ``time_scale`` times faster (``RulesConfig.scaled``) so
that an evaluation sees a few steps, as in production.

A finding of the core that moves when its thresholds move a little (``margins``) is
borderline: two estimators of the same statistic (medians of per-step ratios over the whole
run, ratios of rolling-window medians) may then legitimately decide differently, and
``Expected.borderline`` says so.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import orjson

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.recording import regression_warmup
from argus_core.rules.unit_tests import Series
from argus_core.simulate.cases import Case
from argus_core.simulate.model import SimConfig, simulate

SCENARIO_TIME_SCALE = 25.0  # 15 s evaluations become 0.6 s: ~4 simulated steps each
EXPORTED = ("argus_steps_total", "argus_step_seconds_total", "argus_step_gpu_seconds_total",
            "argus_phase_seconds_total", "argus_step_window_seconds",
            "argus_phase_window_seconds", "argus_phase_order_info")
# The records the exporters' metrics are made of: the core judges the same information.
METRICS_SOURCE = ("rank", "step")


def stretched(case: Case, factor: int, seed: int = 0) -> SimConfig:
    """The case with every step index (length, fault onsets, stall steps) times ``factor``:
    the rules' windows need history before a fault and time after it."""
    faults = tuple(dataclasses.replace(f, start=f.start * factor,
                                       steps=tuple(s * factor for s in f.steps))
                   for f in case.faults)
    return case.config(seed=seed, steps=case.steps * factor, faults=faults)


def last_event_step(config: SimConfig) -> int:
    """The step of the last fault onset or stall (0 without faults)."""
    return max([0, *(f.start for f in config.faults),
                *(s for f in config.faults for s in f.steps)])


def settle_seconds(rules: RulesConfig) -> float:
    """Job time the rules need after the last event to reach their verdicts: half the
    regression's recent window, then its ``for``, the L2 ``for``, and a few evaluations."""
    return (rules.regression_recent / 2 + rules.for_regression + rules.for_straggler
            + 8 * rules.evaluation_interval)


def horizon_seconds(rules: RulesConfig, event_s: float) -> float:
    """Job time (from its first step) by which the rules reach every verdict on an event at
    ``event_s``: ``settle_seconds`` after it, and never before the regression is judged (its
    noise read, and a recent window more so that a regression from the job's first minutes
    is a minority of the changes the noise is read from)."""
    return max(event_s + settle_seconds(rules),
               regression_warmup(rules) + rules.regression_recent + rules.for_regression
               + 8 * rules.evaluation_interval)


def scenario_records(config: SimConfig, rules: RulesConfig) -> list[tuple[int, dict]]:
    """The job's records (through JSON, as sent), until ``horizon_seconds`` of job time (from
    its first step; ``config.steps`` is ignored): long enough for every verdict, no longer
    (promtool evaluates every interval of it)."""
    event = last_event_step(config)
    horizon = start = None
    records = []
    for rank, record in simulate(dataclasses.replace(config, steps=1 << 30)):
        if record["kind"] == "step" and rank == 0:
            t_s = record["t_ns"] * 1e-9
            start = t_s if start is None else start
            if record["step"] == event:
                horizon = start + horizon_seconds(rules, t_s - start)
            if horizon is not None and t_s > horizon:
                break
        records.append((rank, orjson.loads(orjson.dumps(record,
                                                        option=orjson.OPT_SERIALIZE_NUMPY))))
    return records


@dataclass
class Expected:
    """What the core found, in the alerts' terms."""

    spike: bool
    regression: bool
    host_stalls: set[int]
    stragglers: set[tuple[int, str]]  # compute phases (ArgusStragglerRank)
    links: set[tuple[int, str]]  # collectives slow for a whole group (ArgusLinkDegraded)
    borderline: list[str] = dataclasses.field(default_factory=list)


def _findings(found, rules: RulesConfig) -> tuple:
    """The alerts a diagnosis implies: (spike, regression, host stalls, compute stragglers,
    slow collectives)."""
    return (bool(found.l1.spikes), bool(found.l1.regressions),
            frozenset(c.rank for c in found.l1.culprits if c.cause == "host"),
            frozenset((f.rank, f.phase) for f in found.l2.findings if f.kind == "compute"),
            frozenset((f.rank, f.phase) for f in found.l2.findings
                      if f.kind == "communication"))


def metrics_view(config):
    """The core as the metrics pipeline judges: without kernel summaries nothing tells which
    pipeline stages are alike, and the rules' axes (and the scorer without summaries) compare
    the stages as alike; the core on a trace without kernels would not, unless told so."""
    return dataclasses.replace(config, l2=dataclasses.replace(config.l2,
                                                              compare_unlike_stages=True))


def margins(lax: bool):
    """The core's thresholds moved by the margin within which two estimators of the same
    statistic may decide differently (``lax``: towards flagging more)."""
    from argus_core.detect.diagnose import DiagnoseConfig

    sign = -1 if lax else 1
    base = metrics_view(DiagnoseConfig())
    l1, l2 = base.l1, base.l2
    return dataclasses.replace(base, l1=dataclasses.replace(
        l1, spike_ratio=l1.spike_ratio + sign * 0.15,
        min_regression=l1.min_regression + sign * 0.04,
        attribution_share=l1.attribution_share + sign * 0.15),
        l2=dataclasses.replace(l2, min_ratio=l2.min_ratio + sign * 0.04,
                               z_threshold=l2.z_threshold * (1 + sign * 0.25),
                               alpha=l2.alpha * (30.0 ** -sign)))


def core_expectation(trace, rules: RulesConfig) -> Expected:
    """The core's L1/L2 findings on a trace, mapped to the alerts that should fire, and
    whether they are borderline: found differently with every threshold moved by its
    margin one way or the other."""
    from argus_core.detect.diagnose import DiagnoseConfig, diagnose

    spike, regression, hosts, stragglers, links = _findings(
        diagnose(trace, metrics_view(DiagnoseConfig())), rules)
    borderline = []
    for lax in (False, True):
        moved = _findings(diagnose(trace, margins(lax)), rules)
        if moved != (spike, regression, hosts, stragglers, links):
            names = ("spike", "regression", "host stalls", "stragglers", "links")
            changed = [f"{n} {sorted(a) if isinstance(a, frozenset) else a} -> "
                       f"{sorted(b) if isinstance(b, frozenset) else b}"
                       for n, a, b in zip(names, (spike, regression, hosts, stragglers, links),
                                          moved, strict=True) if a != b]
            borderline.append(f"{'lax' if lax else 'strict'} thresholds: {'; '.join(changed)}")
    return Expected(spike=spike, regression=regression, host_stalls=set(hosts),
                    stragglers=set(stragglers), links=set(links), borderline=borderline)


def scrape_series(records: list[tuple[int, dict]], interval_s: float,
                  window_steps: int) -> tuple[list[Series], float]:
    """Every rank's exporter series, sampled each ``interval_s`` of job time as a scrape
    would see them (steps count once they end); returns the series and the job's length."""
    from argus_exporters.health import Health
    from argus_exporters.identity import RankIdentity
    from argus_exporters.metrics import StepMetrics

    identities, steps = {}, defaultdict(list)
    for rank, record in records:
        if record["kind"] == "rank":
            identities[rank] = RankIdentity(record["job"], rank, record["world_size"],
                                            record["local_rank"], record["host"],
                                            record["coords"])
        elif record["kind"] == "step":
            steps[rank].append(record)
    t0 = min(r["t_ns"] for per_rank in steps.values() for r in per_rank)
    end_s = max((r["t_ns"] - t0) * 1e-9 + r["wall_s"] for per_rank in steps.values()
                for r in per_rank)
    samples = int(end_s / interval_s) + 2
    series: dict[tuple, Series] = {}
    for rank, identity in sorted(identities.items()):
        metrics = StepMetrics(identity, Health(), window_steps)
        done = sorted(steps[rank], key=lambda r: r["step"])
        ends = [(r["t_ns"] - t0) * 1e-9 + r["wall_s"] for r in done]
        next_step = 0
        for k in range(samples):
            t = k * interval_s
            while next_step < len(done) and ends[next_step] <= t:
                r = done[next_step]
                metrics.observe(r["wall_s"], r["gpu_s"], r["phases"])
                next_step += 1
            if next_step == 0:
                continue  # nothing to expose before the first step (the exporter starts)
            for family in metrics.collect():
                for sample in family.samples:
                    if sample.name not in EXPORTED:
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    entry = series.get(key)
                    if entry is None:
                        entry = series[key] = Series(sample.name, dict(sample.labels),
                                                     [None] * samples)
                    entry.values[k] = round(float(sample.value), 9)
    return list(series.values()), samples * interval_s


def scorer_series(series: list[Series], rules: RulesConfig) -> list[Series]:
    """What the scorer publishes for L2 (``argus_phase_straggler_ratio``: every finding, or
    with ``l2_source: promql`` those beyond the rules' comparisons) at each of its rounds,
    computed by its own code on the exporters' series as Prometheus would answer its
    queries then, and scraped until the next round (a finding that ends gets a staleness
    marker, as a scrape of the scorer's ``/metrics`` would give it)."""
    from argus_core.detect.l2 import L2Config
    from argus_core.rules.config import L2_PROMQL
    from argus_core.score.core_adapter import all_findings, beyond_promql, judge_phases
    from argus_core.score.snapshot import phase_table_of_results
    from argus_core.taxonomy import is_comm_phase

    wanted = {("argus_phase_window_seconds", stat) for stat in ("median", "min", "p25", "p75")}
    wanted |= {("argus_step_window_seconds", "median"), ("argus_phase_order_info", None)}
    inputs = [s for s in series if (s.name, s.labels.get("stat")) in wanted]
    samples = len(series[0].values) if series else 0
    # The scorer's round is the processors' window, 1 m in production like ``slow_interval``.
    every = max(1, round(rules.slow_interval / rules.evaluation_interval))
    out: dict[tuple, Series] = {}
    for k in range(0, samples, every):
        def answer(name: str, stat: str | None, k=k) -> list[dict]:
            return [{"metric": s.labels, "value": [0, repr(s.values[k])]} for s in inputs
                    if s.name == name and s.labels.get("stat") == stat
                    and s.values[k] is not None]

        table = phase_table_of_results(
            answer("argus_phase_window_seconds", "median"),
            answer("argus_step_window_seconds", "median"),
            answer("argus_phase_order_info", None),
            [m for m in answer("argus_phase_window_seconds", "min")
             if is_comm_phase(m["metric"]["phase"])],
            answer("argus_phase_window_seconds", "p25")
            + answer("argus_phase_window_seconds", "p75"))
        found = {}
        if table is not None and len(table.ranks) >= 2:
            job = inputs[0].labels["job"]
            published = beyond_promql if rules.l2_source == L2_PROMQL else all_findings
            for f in published(judge_phases(table, L2Config()), table):
                labels = {"job": job, "rank": str(f.rank), **f.labels, "phase": f.phase,
                          "axis": f.axis, "kind": f.kind}
                found[tuple(sorted(labels.items()))] = (labels, round(f.ratio, 9))
        for key, (labels, ratio) in found.items():
            entry = out.get(key)
            if entry is None:
                entry = out[key] = Series("argus_phase_straggler_ratio", labels,
                                          [None] * samples)
            entry.values[k:k + every] = [ratio] * len(entry.values[k:k + every])
        for key, entry in out.items():
            if key not in found and k and entry.values[k - 1] not in (None, "stale"):
                entry.values[k] = "stale"
    return list(out.values())


def scenario_test(config: SimConfig, rules: RulesConfig, rule_files: list[str],
                  group_order: list[str]) -> tuple[dict, Expected]:
    """A promtool test document for one simulated job, expecting the core's findings."""
    from argus_core.schema import parse_record
    from argus_core.trace import TraceBuilder

    records = scenario_records(config, rules)
    builder = TraceBuilder()
    for _, record in records:
        if record["kind"] in METRICS_SOURCE:
            builder.add(parse_record(record))
    expected = core_expectation(builder.finish()[config.job], rules)
    series, length = scrape_series(records, rules.evaluation_interval,
                                   rules.exporter_window_steps)
    series += scorer_series(series, rules)
    end = format_duration(np.floor(length / rules.evaluation_interval)
                          * rules.evaluation_interval)
    everything = format_duration(length + rules.evaluation_interval)

    def fired(alert: str, by: str, rows: list[dict]) -> dict:
        return {"expr": f"group by ({by}) (max_over_time(ALERTS{{alertname=\"{alert}\","
                        f"alertstate=\"firing\"}}[{everything}]))",
                "eval_time": end, "exp_samples": rows}

    job = config.job
    exprs = [
        fired("ArgusIterationSpike", "job",
              [{"labels": f'{{job="{job}"}}', "value": 1}] if expected.spike else []),
        fired("ArgusIterationRegression", "job",
              [{"labels": f'{{job="{job}"}}', "value": 1}] if expected.regression else []),
        fired("ArgusHostStall", "rank",
              [{"labels": f'{{rank="{r}"}}', "value": 1} for r in sorted(expected.host_stalls)]),
        fired("ArgusStragglerRank", "rank, phase",
              [{"labels": f'{{phase="{p}",rank="{r}"}}', "value": 1}
               for r, p in sorted(expected.stragglers)]),
        fired("ArgusLinkDegraded", "rank, phase",
              [{"labels": f'{{phase="{p}",rank="{r}"}}', "value": 1}
               for r, p in sorted(expected.links)]),
    ]
    document = {
        "rule_files": rule_files,
        "evaluation_interval": format_duration(rules.evaluation_interval),
        "group_eval_order": group_order,
        "tests": [{"name": f"{job}: rules agree with the core",
                   "interval": format_duration(rules.evaluation_interval),
                   "input_series": [s.document() for s in series],
                   "promql_expr_test": exprs}],
    }
    return document, expected


def write_scenario(config: SimConfig, directory, rules: RulesConfig | None = None):
    """Write the rules (for the axes the job uses) and the scenario's promtool test into
    ``directory``; returns (test file path, what the core found)."""
    from pathlib import Path

    from argus_core.rules.alerts import alert_groups
    from argus_core.rules.generate import ALERTS_FILE, RULES_FILE, to_yaml
    from argus_core.rules.recording import recording_groups
    from argus_core.schema import AXES

    rules = rules or RulesConfig().scaled(SCENARIO_TIME_SCALE)
    # An axis of size one has no peers: the core skips it, and so can the rules here.
    used = tuple(a for a in AXES if getattr(config.topology, a) > 1) or ("dp",)
    rules = dataclasses.replace(rules, axes=used)
    directory = Path(directory)
    recording, alerting = recording_groups(rules), alert_groups(rules)
    for relative, groups in ((RULES_FILE, recording), (ALERTS_FILE, alerting)):
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_text(to_yaml({"groups": groups}))
    order = [g["name"] for g in (*recording, *alerting)]
    document, expected = scenario_test(config, rules, [RULES_FILE, ALERTS_FILE], order)
    path = directory / f"{config.job}.test.yml"
    path.write_bytes(orjson.dumps(document))  # JSON is YAML, and much faster to write
    return path, expected
