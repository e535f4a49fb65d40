"""promtool tests generated from simulator scenarios, with the core's verdicts as expectations.

A scenario is one simulated job. Its records go two ways: through the core (``diagnose``), and
through the exporters' own metrics code (``StepMetrics``, sampled at every evaluation as a
scrape would see it) into a promtool test file whose input series are those samples. The
test's expectations are the core's L1/L2 findings, written as "these alerts fired at some
point, for exactly these jobs, ranks and phases". ``promtool test rules`` passing means the
rules and the core agree on that data; a failure prints both sides.

Simulated steps last ~0.16 s while production assumes a 15 s scrape over steps of a few
seconds; the rules are therefore run ``time_scale`` times faster (``RulesConfig.scaled``) so
that an evaluation sees a few steps, as in production.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import orjson

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.unit_tests import Series
from argus_core.simulate.cases import Case
from argus_core.simulate.model import SimConfig, simulate

SCENARIO_TIME_SCALE = 25.0  # 15 s evaluations become 0.6 s: ~4 simulated steps each
EXPORTED = ("argus_steps_total", "argus_step_seconds_total", "argus_step_gpu_seconds_total",
            "argus_phase_seconds_total", "argus_step_window_seconds",
            "argus_phase_window_seconds")


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


def scenario_records(config: SimConfig, rules: RulesConfig) -> list[tuple[int, dict]]:
    """The job's records (through JSON, as sent), until ``settle_seconds`` of job time after
    its last event (``config.steps`` is ignored): long enough for every verdict, no longer
    (promtool evaluates every interval of it)."""
    event = last_event_step(config)
    horizon = None
    records = []
    for rank, record in simulate(dataclasses.replace(config, steps=1 << 30)):
        if record["kind"] == "step" and rank == 0:
            t_s = record["t_ns"] * 1e-9
            if record["step"] == event:
                horizon = t_s + settle_seconds(rules)
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


def core_expectation(trace, event_step: int, rules: RulesConfig) -> Expected:
    """The core's L1/L2 findings on a trace, mapped to the alerts that should fire, and the
    statistics that sit too close to a threshold to expect two estimators to agree."""
    from argus_core.detect.diagnose import diagnose
    from argus_core.taxonomy import is_comm_phase

    found = diagnose(trace)
    borderline = []
    steps, iteration = found.l1.steps, found.l1.iteration_s
    before = iteration[(steps >= rules.warmup_steps) & (steps < event_step)]
    after = iteration[steps > event_step + 2]
    if event_step and len(before) and len(after):
        shift = float(np.median(after) / np.median(before))
        if rules.min_regression - 0.05 <= shift <= rules.min_regression + 0.1:
            borderline.append(f"iteration time shifted {shift:.3f}x")
    if found.l2.ratios is not None:
        compute = [not is_comm_phase(n) for n in found.matrix.phase_names]
        ratios = found.l2.ratios[:, compute]
        near = (ratios >= rules.l2_min_ratio - 0.1) & (ratios <= rules.l2_min_ratio + 0.15)
        if near.any():
            borderline.append(f"{int(near.sum())} L2 ratio(s) near {rules.l2_min_ratio}")
    return Expected(
        spike=bool(found.l1.spikes), regression=bool(found.l1.regressions),
        host_stalls={c.rank for c in found.l1.culprits if c.cause == "host"},
        stragglers={(f.rank, f.phase) for f in found.l2.findings if f.kind == "compute"},
        links={(f.rank, f.phase) for f in found.l2.findings if f.kind == "communication"},
        borderline=borderline)


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


def scenario_test(config: SimConfig, rules: RulesConfig, rule_files: list[str],
                  group_order: list[str]) -> tuple[dict, Expected]:
    """A promtool test document for one simulated job, expecting the core's findings."""
    from argus_core.schema import parse_record
    from argus_core.trace import TraceBuilder

    records = scenario_records(config, rules)
    builder = TraceBuilder()
    for _, record in records:
        builder.add(parse_record(record))
    expected = core_expectation(builder.finish()[config.job], last_event_step(config), rules)
    series, length = scrape_series(records, rules.evaluation_interval,
                                   rules.exporter_window_steps)
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
