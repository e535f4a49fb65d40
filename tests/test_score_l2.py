"""The scorer is the single source of L2 (``l2_source: scorer``): what it publishes through its
real path (the exporters' own metrics scraped by a real Prometheus, its queries, the core's
L2, its ``/metrics`` collector) equals the core's L2 on the same simulated data.

For the paper's five cases, a healthy run and random fault specs (topologies with groups of
three or more, pairs and pipeline stages), one job each, all in one Prometheus:

- the published findings (``argus_phase_straggler_ratio``, compute and communication) are
  ``argus diagnose``'s L2 findings on the job's whole run (specs whose findings move with the
  core's thresholds moved by a small margin are redrawn, as in test_rules_agreement);
- the published group statistics are the core's arithmetic on the medians the scorer read,
  recomputed here independently: each group's median of ln(time), the spread pooled over the
  axis's groups (1.4826 MAD, never below the floor), the family-wise z from N, and the
  threshold ``median x exp(max(ln(min_ratio), z x scale)))``; N is the core's own count;
- each published compute finding of a group of three or more is at or above its group's
  published threshold, and every rank at or above one is a finding.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from prom_support import Prometheus, serve_collectors
from prometheus_client.core import GaugeMetricFamily
from rules_scenarios import METRICS_SOURCE, core_expectation
from test_rules_agreement import random_spec

from argus_core.detect.l2 import MIN_SECONDS, L2Config
from argus_core.rules.config import RulesConfig
from argus_core.schema import AXES, parse_record
from argus_core.score.service import ScoreConfig, Scorer
from argus_core.simulate.cases import CASES
from argus_core.simulate.faults import parse_fault
from argus_core.simulate.model import SimConfig, simulate
from argus_core.stats.robust import MAD_TO_SIGMA, family_z
from argus_core.taxonomy import is_comm_phase
from argus_core.topology import axis_groups
from argus_core.trace import TraceBuilder

RANDOM_SEEDS = 5
WINDOW_STEPS = 32  # the exporters' default rolling window


def _scenarios() -> list[SimConfig]:
    configs = [CASES[name].config(seed=0, steps=4 * CASES[name].steps) for name in CASES]
    rng = np.random.default_rng(7)
    for seed in range(RANDOM_SEEDS):
        topology, spec = random_spec(rng)
        configs.append(SimConfig(job=f"random-{seed}", topology=topology, steps=160,
                                 faults=(parse_fault(spec),), seed=seed))
    return configs


class Job:
    """One simulated job: its exporters' final metrics and the core's verdict."""

    def __init__(self, config: SimConfig):
        from argus_exporters.health import Health
        from argus_exporters.identity import RankIdentity
        from argus_exporters.metrics import StepMetrics

        self.config = config
        builder = TraceBuilder()
        metrics: dict[int, StepMetrics] = {}
        for rank, record in simulate(config):
            if record["kind"] not in METRICS_SOURCE:
                continue
            builder.add(parse_record(record))
            if record["kind"] == "rank":
                identity = RankIdentity(record["job"], rank, record["world_size"],
                                        record["local_rank"], record["host"],
                                        record["coords"])
                metrics[rank] = StepMetrics(identity, Health(), WINDOW_STEPS)
            else:
                metrics[rank].observe(record["wall_s"], record["gpu_s"], record["phases"])
        self.expected = core_expectation(builder.finish()[config.job], RulesConfig())
        self.samples = [(s.name, dict(s.labels), s.value) for m in metrics.values()
                        for family in m.collect() for s in family.samples]


class Exporters:
    """Serves every job's exporter samples (as gauges: the scorer reads their values)."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def collect(self):
        families: dict[str, GaugeMetricFamily] = {}
        for job in self.jobs:
            for name, labels, value in job.samples:
                family = families.setdefault(name, GaugeMetricFamily(name, name))
                family.add_sample(name, labels, value)
        yield from families.values()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The jobs, and what one scorer round over all of them publishes, by metric name."""
    jobs = [Job(config) for config in _scenarios()]
    server, target = serve_collectors(Exporters(jobs))
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), {"exporters": target}).start()
    try:
        prom.wait_for("argus_steps_total", count=sum(j.config.topology.world_size
                                                     for j in jobs))
        scorer = Scorer(ScoreConfig(prometheus=prom.url, interval_s=1, rate_window="5s",
                                    timeout_s=30))
        assert scorer.run_round()
        out: dict[str, list[tuple[dict, float]]] = defaultdict(list)
        for family in scorer.collect():
            for sample in family.samples:
                out[sample.name].append((dict(sample.labels), sample.value))
        yield jobs, out
    finally:
        prom.stop()
        server.shutdown()


def _of(out, name: str, job: str) -> list[tuple[dict, float]]:
    return [(labels, value) for labels, value in out.get(name, []) if labels["job"] == job]


def _medians(job: Job) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(coords, ranks x compute phases medians, phase names) as the exporters report them."""
    rows = {}
    coords = {}
    for name, labels, value in job.samples:
        if name == "argus_phase_window_seconds" and labels["stat"] == "median":
            rank = int(labels["rank"])
            rows.setdefault(rank, {})[labels["phase"]] = value
            coords[rank] = tuple(int(labels[a]) for a in AXES)
    ranks = sorted(rows)
    phases = sorted({p for r in rows.values() for p in r if not is_comm_phase(p)})
    values = np.array([[rows[r].get(p, np.nan) for p in phases] for r in ranks])
    return np.array([coords[r] for r in ranks]), values, phases


def _reference(job: Job, tests: int) -> tuple[dict, dict, float]:
    """The core's group statistics, recomputed here: {(axis, phase, group labels): (median,
    threshold)}, {(axis, phase): scale}, z."""
    config = L2Config()
    z = max(config.z_threshold, family_z(tests, config.alpha))
    coords, values, phases = _medians(job)
    log_t = np.log(np.maximum(values, MIN_SECONDS))
    groups, scales = {}, {}
    for k, axis in enumerate(AXES):
        if len(np.unique(coords[:, k])) < 2:
            continue
        gid = axis_groups(coords, axis)
        sizes = np.bincount(gid)
        big = np.flatnonzero(sizes >= 3)
        if not len(big):
            continue
        for c, phase in enumerate(phases):
            medians = {g: float(np.median(log_t[gid == g, c])) for g in big.tolist()}
            s = np.concatenate([log_t[gid == g, c] - m for g, m in medians.items()])
            s = s[np.isfinite(s)]
            pooled = (MAD_TO_SIGMA * float(np.median(np.abs(s - np.median(s))))
                      if len(s) >= config.min_pool else 0.0)
            scale = max(config.scale_floor, pooled)
            scales[(axis, phase)] = scale
            margin = max(math.log(config.min_ratio), z * scale)
            for g, m in medians.items():
                first = coords[np.flatnonzero(gid == g)[0]]
                key = (axis, phase, tuple((a, str(first[j])) for j, a in enumerate(AXES)
                                          if a != axis))
                groups[key] = (math.exp(m), math.exp(m + margin))
    return groups, scales, z


def test_published_findings_are_the_cores(published):
    jobs, out = published
    checked = 0
    for job in jobs:
        name = job.config.job
        if job.expected.borderline:
            continue  # the whole run and the last window may then legitimately differ
        found = {(int(labels["rank"]), labels["phase"], labels["kind"])
                 for labels, _ in _of(out, "argus_phase_straggler_ratio", name)}
        core = ({(r, p, "compute") for r, p in job.expected.stragglers}
                | {(r, p, "communication") for r, p in job.expected.links})
        assert found == core, f"{name} {job.config.faults}: scorer {found}, core {core}"
        checked += 1
    assert checked >= len(jobs) - 2  # a borderline draw or two at most
    assert any(job.expected.stragglers for job in jobs)
    assert any(job.expected.links for job in jobs)


def test_published_group_statistics_are_the_cores(published):
    jobs, out = published
    compared = 0
    for job in jobs:
        name = job.config.job
        (_, tests), = [(lab, v) for lab, v in _of(out, "argus_scorer_l2_tests", name)]
        groups, scales, z = _reference(job, int(tests))
        (_, z_published), = _of(out, "argus_l2_z_family", name)
        assert z_published == pytest.approx(z, rel=1e-12)
        assert {(lab["axis"], lab["phase"]): v
                for lab, v in _of(out, "argus_l2_log_ratio_scale", name)} == pytest.approx(
            scales, rel=1e-9), name
        medians = {_key(lab): v for lab, v in _of(out, "argus_l2_group_median_seconds", name)}
        thresholds = {_key(lab): v
                      for lab, v in _of(out, "argus_l2_group_threshold_seconds", name)}
        assert set(medians) == set(thresholds) == set(groups), name
        for key, (median, threshold) in groups.items():
            assert medians[key] == pytest.approx(median, rel=1e-9), (name, key)
            assert thresholds[key] == pytest.approx(threshold, rel=1e-9), (name, key)
        compared += len(groups)
    assert compared > 100


def test_findings_and_thresholds_say_the_same(published):
    """A rank of a group of three or more is a compute finding exactly when it reaches its
    group's published threshold on some axis (one finding per rank and phase: its
    strongest axis)."""
    jobs, out = published
    for job in jobs:
        name = job.config.job
        thresholds = {_key(lab): v
                      for lab, v in _of(out, "argus_l2_group_threshold_seconds", name)}
        coords, values, phases = _medians(job)
        above = set()
        for (axis, phase, group), threshold in thresholds.items():
            k, c = AXES.index(axis), phases.index(phase)
            others = [j for j in range(len(AXES)) if j != k]
            members = np.all(coords[:, others] == [int(v) for _, v in group], axis=1)
            above |= {(int(r), phase) for r in np.flatnonzero(
                members & (np.maximum(values[:, c], MIN_SECONDS) >= threshold))}
        findings = {(int(lab["rank"]), lab["phase"]): lab["axis"]
                    for lab, _ in _of(out, "argus_phase_straggler_ratio", name)
                    if lab["kind"] == "compute"}
        assert above <= set(findings), name
        in_groups = {key for key, axis in findings.items() if _group_size(coords, key[0], axis)
                     >= 3}
        assert in_groups <= above, name


def _group_size(coords: np.ndarray, row: int, axis: str) -> int:
    """Members of the ``axis`` group of the rank in matrix row ``row``."""
    gid = axis_groups(coords, axis)
    return int(np.bincount(gid)[gid[row]])


def _key(labels: dict) -> tuple:
    return (labels["axis"], labels["phase"],
            tuple((a, labels[a]) for a in AXES if a != labels["axis"]))
