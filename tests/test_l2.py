"""L2: parallel-group comparison, robust z in small groups, waiters versus stragglers."""

from __future__ import annotations

import numpy as np
import pytest
from support import seeds

from argus_core.detect.l2 import detect_l2
from argus_core.detect.steps import StepMatrix
from argus_core.stats.robust import family_z, healthy_centre_spread, median_of_others
from argus_core.topology import Topology


def phase_matrix(values: dict[str, np.ndarray], steps=20, seed=0) -> StepMatrix:
    """Per-rank phase times (ranks,) repeated over steps with 2% noise."""
    rng = np.random.default_rng(seed)
    names = list(values)
    ranks = len(next(iter(values.values())))
    phases = np.stack([np.asarray(values[n])[:, None] * np.exp(
        rng.normal(0, 0.02, (ranks, steps))) for n in names], axis=2)
    total = phases.sum(axis=2)
    return StepMatrix(np.arange(ranks), np.arange(steps), np.arange(steps) * 10**9, total,
                      total, phases, names)


def test_sample_z_ceiling_is_avoided():
    """Group of 8 with one 1.5x rank: flagged although a sample z-score cannot exceed 2.47."""
    mlp = np.full(8, 0.1)
    mlp[5] = 0.15
    m = phase_matrix({"mlp": mlp})
    sample_z = (mlp[5] - mlp.mean()) / mlp.std(ddof=1)
    assert sample_z < (8 - 1) / np.sqrt(8) + 1e-9
    result = detect_l2(m, Topology(dp=8).coords(), np.ones(20, dtype=bool))
    assert [(f.rank, f.phase, f.axis, f.kind) for f in result.findings] == [
        (5, "mlp", "dp", "compute")]
    assert result.findings[0].z > 4


@pytest.mark.parametrize("seed", seeds(3))
def test_groups_of_four_work(seed):
    """The smallest useful group (4 pipeline stages) still isolates the slow stage."""
    backward = np.array([0.2, 0.2, 0.2, 0.38])
    result = detect_l2(phase_matrix({"backward": backward}, seed=seed), Topology(pp=4).coords(),
                       np.ones(20, dtype=bool))
    assert [(f.rank, f.axis) for f in result.findings] == [(3, "pp")]
    assert result.findings[0].ratio == pytest.approx(1.9, rel=0.05)


@pytest.mark.parametrize("seed", seeds(3))
def test_ranks_only_compared_within_their_group(seed):
    """Two TP groups of 4 with different speeds are not outliers of each other."""
    attention = np.array([0.1] * 4 + [0.2] * 4)  # tp groups {0-3} and {4-7}
    result = detect_l2(phase_matrix({"attention": attention}, seed=seed),
                       Topology(tp=4, dp=2).coords(), np.ones(20, dtype=bool))
    assert result.findings == []


@pytest.mark.parametrize("seed", seeds(3))
def test_long_collective_means_waiting_not_a_slow_link(seed):
    """Rank 2's slow mlp makes its peers wait in dp-allreduce: they are waiters, it is late."""
    mlp = np.full(4, 0.1)
    mlp[2] = 0.3
    comm = 0.01 + (mlp.max() - mlp)  # the wait lands in the collective
    result = detect_l2(phase_matrix({"mlp": mlp, "dp-allreduce": comm}, seed=seed),
                       Topology(dp=4).coords(), np.ones(20, dtype=bool))
    assert [(f.rank, f.phase) for f in result.findings] == [(2, "mlp")]
    roles = {(r.rank, r.role) for r in result.roles}
    assert roles == {(0, "waiter"), (1, "waiter"), (3, "waiter"), (2, "late")}
    assert result.wait_s[0] == pytest.approx(0.2, rel=0.1) and result.wait_s[2] < 0.01


@pytest.mark.parametrize("seed", seeds(3))
def test_slow_link_shows_as_a_whole_group(seed):
    """One DP group's all-reduce slow for every member (even the last to arrive): communication."""
    topo = Topology(dp=4, tp=4)
    coords = topo.coords()
    comm = np.where(coords[:, 1] == 2, 0.05, 0.01)  # DP group with tp index 2
    result = detect_l2(phase_matrix({"mlp": np.full(16, 0.1), "dp-allreduce": comm}, seed=seed),
                       coords, np.ones(20, dtype=bool))
    flagged = sorted(f.rank for f in result.findings)
    assert flagged == sorted(np.flatnonzero(coords[:, 1] == 2).tolist())
    assert {f.kind for f in result.findings} == {"communication"}


def test_median_of_others_and_fences():
    """Helpers: leave-one-out medians; the healthy spread ignores a degraded upper half but
    reads a skewed healthy row by its middle."""
    v = np.array([[1.0, 2.0, 3.0, 10.0]])
    np.testing.assert_allclose(median_of_others(v), [[3, 3, 2, 2]])
    scores = np.array([[0.01, 0.012, 0.011, 0.013, 2.0, 2.1, 2.2, 2.05]])
    centre, spread = healthy_centre_spread(scores)
    assert centre[0] + 4 * spread[0] < 0.1  # the degraded half cannot widen the fence
    rng = np.random.default_rng(0)
    skewed = np.exp(rng.normal(0, 0.5, (1, 400))) * 0.02
    centre, spread = healthy_centre_spread(skewed)
    assert centre[0] == pytest.approx(np.median(skewed)) and spread[0] > 0.008
    assert family_z(10_000) > family_z(10) > 3


@pytest.mark.parametrize("seed", seeds(3))
def test_pairs_are_decided_by_who_waits(seed):
    """dp=2, as measured on a real gloo DDP job: rank 1 sleeps 30 ms in forward, rank 0 waits
    those 30 ms in its all-reduce. Rank 1's forward is the straggler; rank 0's long
    all-reduce is waiting, not a slow link."""
    forward = np.array([0.001, 0.031])
    backward = np.array([0.001, 0.001])
    comm = np.array([0.031, 0.001])
    m = phase_matrix({"forward": forward, "backward": backward, "dp-allreduce": comm}, seed=seed)
    result = detect_l2(m, Topology(dp=2).coords(), np.ones(20, dtype=bool))
    assert [(f.rank, f.phase, f.axis, f.kind) for f in result.findings] == [
        (1, "forward", "dp", "compute")]


def test_pair_without_collective_phase_is_decided_by_unaccounted_time():
    """dp=2 instrumented without a comm hook (only forward, backward, optimizer): rank 0's
    wait is time in no phase (wall minus its phases). That decides the pair."""
    phases = {"forward": np.array([0.001, 0.031]), "backward": np.array([0.001, 0.001]),
              "optimizer": np.array([0.0002, 0.0002])}
    m = phase_matrix(phases)
    m.wall = np.full_like(m.wall, 0.034)  # synchronous: both ranks' steps take as long
    m.gpu = np.full_like(m.gpu, np.nan)  # a CPU job: no device time
    result = detect_l2(m, Topology(dp=2).coords(), np.ones(20, dtype=bool))
    assert [(f.rank, f.phase) for f in result.findings] == [(1, "forward")]


@pytest.mark.parametrize("seed", seeds(3))
def test_arrival_skew_long_collective_with_nobody_late_is_the_link(seed):
    """Equal compute before the collective, ranks 4 and 5's tp-comm 3x longer than their
    group's: nobody arrived late, so it is the link (time minus the shortest would have
    excused it as waiting). Ranks 4 and 5 are named, on their own or as their group (whose
    median collective is then 2x the others'); nothing else is."""
    topo = Topology(tp=4, dp=4)
    comm = np.full(16, 0.002)
    comm[[4, 5]] = 0.006
    m = phase_matrix({"mlp": np.full(16, 0.01), "tp-comm": comm,
                      "optimizer": np.full(16, 0.001)}, seed=seed)
    result = detect_l2(m, topo.coords(), np.ones(20, dtype=bool))
    assert {4, 5} <= {f.rank for f in result.findings}
    assert all((f.phase, f.kind) == ("tp-comm", "communication") for f in result.findings)
    assert all(f.group for f in result.findings if f.rank not in (4, 5))
    assert {f.rank for f in result.findings} <= {4, 5, 6, 7}
    assert not result.roles  # nobody waits


def test_late_straggler_is_judged_on_its_own_slow_steps():
    """512 ranks, 9% step noise, rank 77 1.3x slower from step 15 of 30: the median over all
    steps dilutes it below the threshold, its own onset does not."""
    rng = np.random.default_rng(3)
    topo = Topology(dp=64, tp=8)
    steps = 30
    base = 0.1 * np.exp(rng.normal(0, 0.02, 512))[:, None] * np.exp(
        rng.normal(0, 0.09, (512, steps)))
    base[77, 15:] *= 1.3
    m = StepMatrix(np.arange(512), np.arange(steps), np.arange(steps) * 10**9, base, base,
                   base[:, :, None], ["mlp"])
    result = detect_l2(m, topo.coords(), np.arange(steps) >= 2)
    assert [f.rank for f in result.findings] == [77]
    finding = result.findings[0]
    assert abs(finding.onset - 15) <= 1 and finding.ratio >= 1.25
    assert np.median(base[77, 2:] / np.median(base[:, 2:], axis=0)) < 1.25  # diluted


@pytest.mark.parametrize("seed", range(5))
def test_healthy_large_job_is_silent(seed):
    """1,024 ranks on four axes with 2% persistent rank spread and 5% step noise: the pooled,
    family-wise fences flag nobody, in any phase (compute or collective)."""
    rng = np.random.default_rng(seed)
    topo = Topology(dp=8, tp=8, pp=4, ep=4)
    n = topo.world_size
    speed = np.exp(rng.normal(0, 0.02, n))[:, None]
    phases = {name: base * speed * np.exp(rng.normal(0, 0.05, (n, 20)))
              for name, base in (("mlp", 0.1), ("attention", 0.05), ("tp-comm", 0.004),
                                 ("pp-p2p", 0.001), ("dp-allreduce", 0.01))}
    names = list(phases)
    values = np.stack([phases[k] for k in names], axis=2)
    total = values.sum(axis=2)
    m = StepMatrix(np.arange(n), np.arange(20), np.arange(20) * 10**9, total, total, values,
                   names)
    result = detect_l2(m, topo.coords(), np.ones(20, dtype=bool))
    assert result.findings == []
    assert result.tests > 10_000 and result.z_family > 4.5


def test_unlike_pipeline_stages_are_not_compared():
    """The first and last stages do more work (embedding, loss): compared with the middle
    stages they would look slow; with stage classes they are left alone."""
    topo = Topology(pp=8, dp=4)
    pp = topo.coords()[:, 2]
    attention = np.where(pp == 0, 0.13, np.where(pp == 7, 0.14, 0.1))
    m = phase_matrix({"attention": attention})
    everyone = detect_l2(m, topo.coords(), np.ones(20, dtype=bool))
    heavy = set(np.flatnonzero((pp == 0) | (pp == 7)).tolist())
    assert {f.rank for f in everyone.findings} == heavy  # compared blindly
    classes = np.array([0, 1, 1, 1, 1, 1, 1, 2])[pp]
    assert detect_l2(m, topo.coords(), np.ones(20, dtype=bool), stage_class=classes
                     ).findings == []


def test_pairs_without_collective_timing_are_left_alone():
    """dp=2 with no communication phase: nothing says which member is odd, so no finding."""
    m = phase_matrix({"forward": np.array([0.1, 0.3])})
    assert detect_l2(m, Topology(dp=2).coords(), np.ones(20, dtype=bool)).findings == []


def test_one_step_of_medians_is_judged():
    """A metrics snapshot holds one value per rank and phase (a median over a window): with
    no step noise to read, the pooled spread and the floor judge it, and the straggler is
    found."""
    mlp = np.full(16, 0.1) * np.exp(np.random.default_rng(0).normal(0, 0.01, 16))
    mlp[9] = 0.15
    values = mlp[:, None, None]
    nan = np.full((16, 1), np.nan)
    m = StepMatrix(np.arange(16), np.zeros(1, np.int64), np.zeros(1, np.int64), nan, nan,
                   values, ["mlp"])
    result = detect_l2(m, Topology(dp=16).coords(), np.ones(1, dtype=bool))
    assert [(f.rank, f.phase) for f in result.findings] == [(9, "mlp")]
