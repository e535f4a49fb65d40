"""promtool tests of the recorded statistics: L2 group medians, spreads, thresholds and the
family-wise N and z against the same arithmetic done here and the core's own L2 (or, with
``l2_source: scorer``, the scorer's own published statistics), and the L1 ratios."""

from __future__ import annotations

import math

from argus_core.rules.config import L2_PROMQL, RulesConfig, format_duration
from argus_core.rules.unit_tests.base import (
    Series,
    Steps,
    at_time,
    matchers,
    quantile,
    rank_labels,
    unit_test,
)
from argus_core.stats.robust import MAD_TO_SIGMA


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


def close_to(expr: str, labels: str, value: float, eval_time: str, tolerance: float = 1e-9):
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
    scrape = {**matchers(config.selectors.scorer), "instance": "node-0:9800"}
    series += [Series(name, {**scrape, **labels}, [2 * value] * 2)
               for _, name in GROUP_STATISTICS.values()
               for labels, value in published.get(name, [])]
    at = format_duration(config.evaluation_interval)
    exprs = [{"expr": "job:argus_l2_tests:count", "eval_time": at, "exp_samples": [
        {"labels": 'job:argus_l2_tests:count{job="train"}', "value": stats["tests"]}]},
        close_to("job:argus_l2_z:family", '{job="train"}', stats["z"], at, 1e-7)]
    for (axis, phase), scale in sorted(stats["scale"].items()):
        exprs.append(close_to(f'job_phase:argus_phase_log_ratio:scale{{axis="{axis}",'
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
            exprs.append(close_to(f"axis_group:argus_phase_seconds:{record}{{{selector}}}",
                                labels, value, at))
            exprs.append(close_to(group_statistic(record, f'job="train",{selector}'),
                                labels, value, at))
    return [unit_test(config, "L2 statistics of a dp=8 x tp=4 job (N and z as the core counts)",
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
    scrape = {**matchers(config.selectors.scorer), "instance": "node-0:9800"}
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
        close_to("job:argus_l2_z:family", '{job="train"}', value_of("job:argus_l2_z:family"),
               at)]
    for axis, phase in sorted(stats["scale"]):
        exprs.append(close_to(f'job_phase:argus_phase_log_ratio:scale{{axis="{axis}",'
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
            exprs.append(close_to(group_statistic(record, selector), labels,
                                value_of(name, axis=axis, phase=phase, **others), at))
        # ... and nothing else: one series per group the promql mode would record,
        axes = f'axis=~"{"|".join(config.axes)}"'
        count = len([k for k in stats["groups"] if k[0] in config.axes])
        exprs.append({"expr": f"count({group_statistic(record, axes)})",
                      "eval_time": at, "exp_samples": [{"labels": "{}", "value": count}]})
        # ... none of them recorded again.
        exprs.append({"expr": name, "eval_time": at, "exp_samples": []})
    return unit_test(config, "L2 statistics of a dp=8 x tp=4 job: the scorer's (the core's), "
                 "under the names and labels the dashboards read", series, exprs=exprs)


def l1_recording_tests(config: RulesConfig) -> list[dict]:
    """The L1 spike ratio, and warm-up excluded."""
    tests = []
    steps = Steps(config, 10)
    spike = 3 * steps.step_s
    series = steps.series(rank_labels(config, "spiky", 0), stall={5: spike})
    at = format_duration(6 * config.evaluation_interval)
    tests.append(unit_test(config, "L1 spike ratio: slowest step over the rolling median", series,
                       exprs=[{"expr": "job:argus_iteration_spike:ratio", "eval_time": at,
                               "exp_samples": [{
                                   "labels": 'job:argus_iteration_spike:ratio{job="spiky"}',
                                   "value": (steps.step_s + spike) / steps.step_s}]}]))
    tests.append(host_excess_test(config))
    young = Steps(config, 4, start_steps=0)
    tests.append(unit_test(config, "L1 spike ratio: not judged during warm-up",
                       young.series(rank_labels(config, "young", 0), stall={2: spike}),
                       exprs=[{"expr": "job:argus_iteration_spike:ratio",
                               "eval_time": at_time(config, 3), "exp_samples": []}]))
    return tests


HOST_EXCESS_JOBS = {"solo": [5.0], "pair": [1.0, 4.0], "four": [1.0, 1.0, 2.0, 10.0]}


def host_excess_cases() -> list[tuple[str, int, float, float]]:
    """(job, rank, host seconds, expected excess) for jobs of one, two and four ranks: a
    rank's host time over the lower of the job's median rank and the mean of the other ranks
    (a pair: the partner); a one-rank job's excess is 0."""
    cases = []
    for job, host_s in HOST_EXCESS_JOBS.items():
        for rank, x in enumerate(host_s):
            others = [y for r, y in enumerate(host_s) if r != rank]
            excess = (max(x - quantile(0.5, host_s), x - sum(others) / len(others)) if others
                      else 0.0)
            cases.append((job, rank, x, excess))
    return cases


def host_excess_test(config: RulesConfig) -> dict:
    """ArgusHostStall's excess over the host-time references (``host_excess_cases``)."""
    series, exprs = [], []
    at = format_duration(2 * config.evaluation_interval)
    for job, rank, x, excess in host_excess_cases():
        labels = rank_labels(config, job, rank)
        series.append(Series("rank:argus_host_seconds:increase", labels, [x] * 3))
        selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        exprs.append(close_to(f"rank:argus_host_seconds:excess_increase{{{selector}}}",
                              f"{{{selector}}}", excess, at))
    return unit_test(config, "ArgusHostStall's excess: over the median rank or the mean of the "
                     "others, whichever is lower (a pair: the partner)", series, exprs=exprs)
