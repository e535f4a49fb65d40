"""L1: spikes, regressions, warm-up, and the slowest-rank series."""

from __future__ import annotations

import numpy as np
import pytest

from argus_core.detect.arrival import collective_times
from argus_core.detect.l1 import L1Config, detect_l1, rolling_median
from argus_core.detect.steps import StepMatrix
from argus_core.stats.changepoint import change_points, noise_scale
from argus_core.topology import Topology


def matrix(wall: np.ndarray, gpu: np.ndarray | None = None) -> StepMatrix:
    ranks, steps = wall.shape
    gpu = wall * 0.95 if gpu is None else gpu
    return StepMatrix(np.arange(ranks), np.arange(steps), np.arange(steps) * 10**9, wall, gpu,
                      np.zeros((ranks, steps, 0)), [])


def noisy(ranks=8, steps=60, seed=0, level=0.4):
    rng = np.random.default_rng(seed)
    return level * np.exp(rng.normal(0, 0.02, (ranks, steps)))


def test_healthy_series_has_no_findings():
    """Two percent noise on every rank never produces a spike or a regression."""
    for seed in range(20):
        result = detect_l1(matrix(noisy(seed=seed)))
        assert result.spikes == [] and result.regressions == []


def test_spike_found_with_its_ratio():
    """One rank 10x slow on one step: a job-level spike at that step, about 10x."""
    wall = noisy()
    wall[3, 30] *= 10
    result = detect_l1(matrix(wall))
    assert [s for s, _ in result.spikes] == [30]
    assert result.spikes[0][1] == pytest.approx(10, rel=0.1)
    assert result.regressions == []


def test_regression_onset_and_ratio():
    """A sustained 30% slowdown from step 25 is one regression at 25, ratio ~1.3, no spikes."""
    wall = noisy()
    wall[:, 25:] *= 1.3
    result = detect_l1(matrix(wall))
    assert result.spikes == []
    assert len(result.regressions) == 1
    step, ratio = result.regressions[0]
    assert abs(step - 25) <= 1 and ratio == pytest.approx(1.3, rel=0.05)


def test_recovery_is_not_a_regression():
    """A speed-up (e.g. after warm-up or a fix) is not reported as a regression."""
    wall = noisy()
    wall[:, :20] *= 1.5
    assert detect_l1(matrix(wall)).regressions == []


def test_small_shift_below_threshold_ignored():
    """A 5% shift is below the 10% regression threshold."""
    wall = noisy()
    wall[:, 30:] *= 1.05
    assert detect_l1(matrix(wall)).regressions == []


def test_warmup_steps_are_not_judged():
    """A slow first step (compilation) is not a spike."""
    wall = noisy()
    wall[:, 0] *= 20
    assert detect_l1(matrix(wall)).spikes == []
    assert detect_l1(matrix(wall), L1Config(warmup_steps=0)).spikes[0][0] == 0


def test_spike_attributed_to_the_host_stalled_rank():
    """Wall time up but GPU time flat on rank 2 only: rank 2 is the host culprit."""
    wall = noisy()
    gpu = wall * 0.95
    wall[:, 40] += 3.0
    gpu[:, 40] += 3.0  # the others wait inside a collective: GPU time grows
    gpu[2, 40] -= 3.0  # the stalled rank launched late: its GPU time did not grow
    result = detect_l1(matrix(wall, gpu))
    assert [(c.rank, c.step, c.cause) for c in result.culprits] == [(2, 40, "host")]


def test_missing_records_do_not_break_the_series():
    """Ranks missing some steps (NaN) still give a series; an unrecorded step is skipped."""
    wall = noisy()
    wall[1, 10:20] = np.nan
    wall[:, 33] = np.nan
    result = detect_l1(matrix(wall))
    assert not result.judged[33] and result.spikes == [] and result.regressions == []


def test_rolling_median_centred():
    """The centred median follows a step change without lag."""
    y = np.r_[np.ones(10), np.full(10, 2.0)]
    med = rolling_median(y, 5)
    assert med[9] == 1 and med[10] == 2


def test_change_points_and_noise_scale():
    """Binary segmentation finds both shifts of a two-step series; noise ignores the shifts."""
    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(30), np.full(30, 1.0), np.full(30, 0.3)] + rng.normal(0, 0.05, 90)
    sigma = noise_scale(y)
    assert sigma == pytest.approx(0.05, rel=0.3)
    assert change_points(y, 6.0, 3, 0.1, sigma) == [30, 60]


def phase_steps(ranks=4, steps=40, seed=0):
    """(wall, gpu, phases) of a synchronous dp job: forward, backward, dp-allreduce."""
    rng = np.random.default_rng(seed)
    forward = 0.02 * np.exp(rng.normal(0, 0.02, (ranks, steps)))
    backward = 0.04 * np.exp(rng.normal(0, 0.02, (ranks, steps)))
    own = forward + backward
    comm = 0.005 + (own.max(axis=0) - own)  # early ranks wait for the last one
    phases = np.stack([forward, backward, comm], axis=2)
    gpu = phases.sum(axis=2)
    wall = gpu.max(axis=0)[None, :] + 0.002
    return wall + np.zeros((ranks, 1)), gpu, phases


def dp_matrix(wall, gpu, phases) -> StepMatrix:
    ranks, steps = wall.shape
    return StepMatrix(np.arange(ranks), np.arange(steps), np.arange(steps) * 10**9, wall, gpu,
                      phases, ["forward", "backward", "dp-allreduce"])


def l1_of_own_times(phases: np.ndarray):
    """L1 of a dp job whose ranks' forward and backward are ``phases[..., :2]``: each rank
    waits in the all-reduce for the slowest (``phases[..., 2]`` rewritten), the step ends
    with it."""
    own = phases[:, :, 0] + phases[:, :, 1]
    phases[:, :, 2] = 0.005 + (own.max(axis=0) - own)
    gpu = phases.sum(axis=2)
    wall = gpu.max(axis=0)[None, :] + 0.002 + np.zeros((len(phases), 1))
    m = dp_matrix(wall, gpu, phases)
    return detect_l1(m, times=collective_times(m, Topology(dp=len(phases)).coords()))


def test_sustained_host_stall_is_attributed_to_its_rank():
    """Rank 1 sleeps 120 ms before every all-reduce from step 8 on (device idle, phases flat);
    the others wait for it inside the all-reduce. The regression is rank 1's, cause host."""
    wall, gpu, phases = phase_steps()
    gpu[1, 8:] += 0.12  # idle inside its step: GPU time up, no phase longer
    phases[[0, 2, 3], 8:, 2] += 0.12  # the others wait in the collective
    gpu[[0, 2, 3], 8:] += 0.12
    wall[:, 8:] += 0.12
    m = dp_matrix(wall, gpu, phases)
    result = detect_l1(m, times=collective_times(m, Topology(dp=4).coords()))
    assert [s for s, _ in result.regressions] == [8]
    assert [(c.rank, c.step, c.cause, c.event) for c in result.culprits] == [
        (1, 8, "host", "regression")]
    assert result.culprits[0].excess_s == pytest.approx(0.12, rel=0.05)
    assert result.culprits[0].last_step == 39


def test_regression_of_a_compute_straggler_is_attributed():
    """Rank 3's backward doubles from step 20: the regression is its compute."""
    _, _, phases = phase_steps()
    phases[3, 20:, 1] *= 2
    result = l1_of_own_times(phases)
    assert [(c.rank, c.cause) for c in result.culprits] == [(3, "compute")]


@pytest.mark.parametrize("seed", range(10))
def test_a_slowdown_that_rises_in_steps_is_one_episode(seed):
    """Rank 3's backward takes 1.5x from step 20 and 2.5x from step 26 (a second process
    taking more of its core) to the trace's end: two rises, one episode. Its culprit spans
    the whole of it (each rise judged alone against the level just before it would end the
    first at step 25, too short to be a verdict, and excuse the second as too small a rise)."""
    _, _, phases = phase_steps(seed=seed)
    phases[3, 20:, 1] *= 1.5
    phases[3, 26:, 1] *= 2.5 / 1.5
    result = l1_of_own_times(phases)
    assert [s for s, _ in result.regressions][:1] == [20]
    first = next(c for c in result.culprits if c.step == 20)
    assert (first.rank, first.cause, first.last_step) == (3, "compute", 39)
    assert first.excess_s > 0.04  # the episode's median rise, not its first level's


def test_job_wide_slowdown_has_no_culprit():
    """Every rank slows down alike (a shared cause): a regression, and nobody to blame."""
    wall, gpu, phases = phase_steps()
    wall[:, 20:] *= 1.5
    gpu[:, 20:] *= 1.5
    phases[:, 20:] *= 1.5
    result = detect_l1(dp_matrix(wall, gpu, phases))
    assert [s for s, _ in result.regressions] == [20] and result.culprits == []


@pytest.mark.parametrize(("factor", "on_the_host"), [(1.25, False), (1.4, False), (2.0, True)])
def test_a_rank_a_little_slower_is_a_culprit_on_a_device_but_not_on_the_host_clock(
        factor, on_the_host):
    """Rank 3's forward and backward take ``factor`` times as long from step 20: the job
    regresses and rank 3's compute explains it. Timed on a device, any rise that explains the
    job's is a culprit; on the host clock, where the scheduler moves a rank's share of shared
    cores by up to a third for tens of steps, only a rise of half its own level or more."""
    wall, gpu, phases = phase_steps()
    phases[3, 20:, :2] *= factor
    own = phases[:, :, 0] + phases[:, :, 1]
    phases[:, :, 2] = 0.005 + (own.max(axis=0) - own)
    gpu = phases.sum(axis=2)
    wall = gpu.max(axis=0)[None, :] + 0.002 + np.zeros((4, 1))
    m = dp_matrix(wall, gpu, phases)
    times = collective_times(m, Topology(dp=4).coords())
    device = detect_l1(m, L1Config().on_clock(True), times)
    assert [s for s, _ in device.regressions] == [20]
    assert [(c.rank, c.cause) for c in device.culprits] == [(3, "compute")]
    host = detect_l1(m, L1Config().on_clock(False), times)
    assert [s for s, _ in host.regressions] == [20]
    assert [(c.rank, c.cause) for c in host.culprits] == ([(3, "compute")] if on_the_host
                                                          else [])
