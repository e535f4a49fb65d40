"""The scorer on real jobs: every recording of a real torch job (tests/data/real_jobs) replayed
through the exporters' own rolling windows (``StepMetrics``, what each rank serves Prometheus),
and the scorer's judgement (``core_adapter.judge``) of the job at every scrape along the run.

What Alertmanager would page on is what the scorer publishes: its L2 findings worth a page.
On a real job a finding is on the faulty rank or it is a false page; the waiting ranks of a
late or slow peer (whose collectives are mostly waiting) and healthy jobs' noise get none.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_real_jobs import DATA, EXPECTED, RANKS, RECORDINGS, _case

from argus_core.detect.steps import step_matrix
from argus_core.reader import load_traces
from argus_core.score.core_adapter import judge
from argus_core.score.service import Published, ScoreConfig, Scorer
from argus_core.score.snapshot import (
    JobSnapshot,
    concat,
    on_host_clock,
    phase_table_of_results,
)
from argus_core.score.vector_columns import columns_from_result
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.metrics import StepMetrics

WINDOW_STEPS = 32  # the exporters' default ARGUS_WINDOW_STEPS
SCRAPE_EVERY = 8  # steps between two replayed scrapes


def _series(families, wanted: dict[str, dict[str, str]]) -> dict[str, list[dict]]:
    """The collector's samples as Prometheus query results, per metric name (with the
    sample's labels matching ``wanted[name]``)."""
    out: dict[str, list[dict]] = {name: [] for name in wanted}
    for family in families:
        for sample in family.samples:
            match = wanted.get(sample.name)
            if match is not None and all(sample.labels.get(k) == v for k, v in match.items()):
                out[sample.name].append({"metric": dict(sample.labels),
                                         "value": [0, repr(sample.value)]})
    return out


def scrapes(path: Path):
    """(step, JobSnapshot) every ``SCRAPE_EVERY`` steps once the windows are full, and at the
    last step:
    each rank's recorded steps fed, in order, to its own exporter ``StepMetrics`` (timing on
    the host clock, as the CPU jobs' exporters did)."""
    trace = next(iter(load_traces([path]).traces.values()))
    matrix = step_matrix(trace.steps)
    coords = trace.coords(matrix.ranks)
    metrics = []
    for i, rank in enumerate(matrix.ranks.tolist()):
        info = trace.ranks.get(rank)
        identity = RankIdentity(job=trace.job, rank=rank, world_size=len(matrix.ranks),
                                local_rank=0, host=info.host if info else "vm",
                                coords=dict(zip(("dp", "tp", "pp", "ep"), coords[i].tolist(),
                                                strict=True)))
        metrics.append(StepMetrics(identity, Health(), WINDOW_STEPS, clock="host"))
    names = matrix.phase_names
    last = matrix.phases.shape[1] - 1
    for s in range(last + 1):
        for i, m in enumerate(metrics):
            if np.isnan(matrix.wall[i, s]):
                continue
            row = matrix.phases[i, s]
            wait = matrix.cpu_wait[i, s] if matrix.cpu_wait is not None else np.nan
            m.observe(float(matrix.wall[i, s]), float(np.nan_to_num(matrix.gpu[i, s])),
                      {n: float(v) for n, v in zip(names, row, strict=True) if np.isfinite(v)},
                      float(wait) if np.isfinite(wait) else None)
        if s != last and (s + 1 < WINDOW_STEPS or (s + 1) % SCRAPE_EVERY):
            continue
        wanted = {"argus_phase_window_seconds": {}, "argus_step_window_seconds":
                  {"stat": "median"}, "argus_phase_order_info": {},
                  "argus_step_cpu_wait_window_seconds": {"stat": "median"},
                  "argus_phase_clock_info": {}}
        series = {name: [] for name in wanted}
        for m in metrics:
            for name, found in _series(m.collect(), wanted).items():
                series[name] += found
        phases = series["argus_phase_window_seconds"]
        table = phase_table_of_results(
            [p for p in phases if p["metric"]["stat"] == "median"],
            series["argus_step_window_seconds"], series["argus_phase_order_info"],
            [p for p in phases if p["metric"]["stat"] == "min" and "-" in p["metric"]["phase"]],
            [p for p in phases if p["metric"]["stat"] in ("p25", "p75")])
        waits = {int(w["metric"]["rank"]): float(w["value"][1])
                 for w in series["argus_step_cpu_wait_window_seconds"]}
        yield s, JobSnapshot(job=trace.job, summary=concat([], {}, 60 * 10**9), phases=table,
                             coords={int(r): tuple(c) for r, c in
                                     zip(matrix.ranks.tolist(), coords.tolist(), strict=True)},
                             cpu_wait=waits,
                             host_clock=on_host_clock(columns_from_result(
                                 series["argus_phase_clock_info"], (), ("clock",))))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.split(".")[0])
def test_the_scorer_pages_only_on_the_faulty_rank_of_a_real_job(path):
    """No scrape of a real job gets a published L2 finding on a rank no fault touched: not
    the waiting ranks of a late peer, not a healthy job's noise."""
    faulty = set(EXPECTED[_case(path)])
    judged = 0
    for step, snapshot in scrapes(path):
        judged += 1
        false = [(f.rank, f.phase, f.kind, round(f.ratio, 2)) for f in judge(snapshot).phases
                 if f.rank not in faulty]
        assert not false, f"step {step}: {false}"
    assert judged


def test_the_scorer_widens_its_floor_only_for_ranks_timed_on_the_host_clock():
    """A healthy real job whose rank 1 ran 1.3-1.6x slower than rank 0 in every phase (the
    scheduler's share of its cores) pages on no scrape, as its exporters said their clock was
    the host's. The same windows from exporters that timed on a device (ranks agree to
    ``l2.scale_floor`` there) page on rank 1."""
    path = DATA / "healthy-2-run4.ndjson.gz"
    device_pages = 0
    for step, snapshot in scrapes(path):
        assert snapshot.host_clock
        assert not judge(snapshot).phases, f"step {step}"
        device = judge(dataclasses.replace(snapshot, host_clock=False)).phases
        assert {f.rank for f in device} <= {1}
        device_pages += bool(device)
    assert device_pages


# a rank short of CPU (a hog on its core) is slow in its phases too: the scorer publishes its
# compute finding, and its verdict is host (its CPU wait, as argus diagnose reads it). A
# one-rank job has no peer to compare a rank's window with: its slowdown against its own past
# is L1's (argus diagnose; live, the iteration-regression rule), not the scorer's
SUSTAINED_COMPUTE = sorted(case for case, expected in EXPECTED.items()
                           if ("compute" in expected.values() or case.startswith("hog"))
                           and not case.startswith("tail") and RANKS[case] > 1)


@pytest.mark.parametrize("case", SUSTAINED_COMPUTE)
def test_the_scorer_names_a_real_jobs_slow_rank(case):
    """A rank slowed for the whole run (extra compute, a CPU hog on its core) is published
    as a compute finding in at least half of the scrapes of its recordings: the noise that
    keeps healthy ranks quiet does not hide it."""
    faulty = set(EXPECTED[case])
    found = judged = 0
    for path in (p for p in RECORDINGS if _case(p) == case):
        for _, snapshot in scrapes(path):
            judged += 1
            found += any(f.rank in faulty and f.kind == "compute"
                         for f in judge(snapshot).phases)
    assert judged and found >= judged / 2, f"{found} of {judged} scrapes"


HOGGED = sorted(case for case in EXPECTED if case.startswith("hog") and RANKS[case] > 1)


@pytest.mark.parametrize("case", HOGGED)
def test_the_scorer_calls_a_rank_short_of_cpu_host_as_diagnose_does(case):
    """A rank sharing its core with a busy process: its phases are slow (published as a
    compute finding), and its verdict is host, from the CPU wait its exporter serves
    (``argus_step_cpu_wait_window_seconds``), at every scrape that has a verdict for it;
    at least half of the scrapes do. Each such verdict is published as the rank's extra wait
    (``argus_rank_short_of_cpu_seconds``, what ArgusRankShortOfCPU fires on and
    ArgusStragglerRank leaves out), for that rank only."""
    faulty = set(EXPECTED[case])
    with_verdict = judged = 0
    for path in (p for p in RECORDINGS if _case(p) == case):
        for step, snapshot in scrapes(path):
            judged += 1
            assert snapshot.cpu_wait and set(snapshot.cpu_wait) == set(snapshot.coords)
            judgement = judge(snapshot)
            causes = {cause for rank, cause in judgement.verdicts if rank in faulty}
            assert causes <= {"host"}, f"step {step}: {causes}"
            assert set(judgement.short_of_cpu) == ({r for r, _ in judgement.verdicts} & faulty)
            assert all(wait > 0 for wait in judgement.short_of_cpu.values())
            if causes and not with_verdict:  # what /metrics serves of it, once
                served = _served_short_of_cpu(snapshot.job, judgement)
                hosts = {f.rank: f.labels["host"] for f in judgement.phases}
                assert served == {(str(r), hosts[r]): wait
                                  for r, wait in judgement.short_of_cpu.items()}
            with_verdict += bool(causes)
    assert judged and with_verdict >= judged / 2, f"{with_verdict} of {judged} scrapes"


def _served_short_of_cpu(job: str, judgement) -> dict[tuple[str, str], float]:
    """``argus_rank_short_of_cpu_seconds`` as a scorer that published ``judgement`` serves
    it: (rank, host) -> seconds."""
    scorer = Scorer(ScoreConfig(prometheus="http://127.0.0.1:9"))
    scorer.published = Published(judgements={job: judgement})
    return {(s.labels["rank"], s.labels["host"]): s.value for family in scorer.collect()
            for s in family.samples if s.name == "argus_rank_short_of_cpu_seconds"}
