"""Waiting measured from arrival skew: who entered each collective when, not who was shortest."""

from __future__ import annotations

import numpy as np
import pytest

from argus_core.detect.arrival import collective_times
from argus_core.detect.steps import StepMatrix
from argus_core.topology import Topology


def matrix(phases: dict[str, np.ndarray], wall: np.ndarray | None = None,
           gpu: np.ndarray | None = None, steps: int = 10) -> StepMatrix:
    """Per-rank phase times (ranks,), the same every step; wall/gpu default to their sum."""
    names = list(phases)
    ranks = len(next(iter(phases.values())))
    values = np.stack([np.repeat(np.asarray(phases[n], float)[:, None], steps, 1)
                       for n in names], axis=2)
    total = values.sum(axis=2)
    wall = total if wall is None else np.repeat(np.asarray(wall, float)[:, None], steps, 1)
    gpu = total if gpu is None else np.repeat(np.asarray(gpu, float)[:, None], steps, 1)
    starts = np.arange(steps, dtype=np.int64)[None, :] * 10**9 + np.zeros((ranks, 1), np.int64)
    return StepMatrix(np.arange(ranks), np.arange(steps), starts[0], wall, gpu, values, names,
                      starts, starts)


def test_peers_of_a_late_rank_wait_for_it():
    """Rank 2's mlp is 0.2 s longer: the others wait 0.2 s in dp-allreduce, rank 2 none."""
    mlp = np.array([0.1, 0.1, 0.3, 0.1])
    comm = 0.01 + (mlp.max() - mlp)
    times = collective_times(matrix({"mlp": mlp, "dp-allreduce": comm}), Topology(dp=4).coords())
    wait = times.wait[:, 0, 1]
    np.testing.assert_allclose(wait, [0.2, 0.2, 0.0, 0.2], atol=1e-9)
    np.testing.assert_allclose(times.transfer[:, 0, 1], 0.01, atol=1e-9)


def test_long_collectives_with_nobody_late_are_transfer():
    """Equal compute before the collective, ranks 0 and 1 spend 3x longer in it: nobody
    arrived late, so none of it is waiting (time minus the group's shortest would call it so).
    """
    comm = np.array([0.03, 0.03, 0.01, 0.01])
    times = collective_times(matrix({"mlp": np.full(4, 0.1), "dp-allreduce": comm}),
                             Topology(dp=4).coords())
    np.testing.assert_allclose(times.wait[:, 0, 1], 0.0, atol=1e-9)
    np.testing.assert_allclose(times.transfer[:, 0, 1], comm)


def test_host_stall_before_the_step_is_a_late_arrival():
    """Rank 3's host stalls 0.5 s before the step (wall - GPU): its peers' first collective
    waits for it, and that wait is recognised as waiting."""
    comm = np.array([0.51, 0.51, 0.51, 0.01])
    m = matrix({"forward": np.full(4, 0.1), "dp-allreduce": comm}, wall=np.full(4, 0.62),
               gpu=np.array([0.61, 0.61, 0.61, 0.11]))
    times = collective_times(m, Topology(dp=4).coords())
    np.testing.assert_allclose(times.wait[:3, 0, 1], 0.5, atol=1e-9)
    assert times.wait[3, 0, 1] == 0
    np.testing.assert_allclose(times.host_s[:, 0], [0.01, 0.01, 0.01, 0.51])


def test_host_stall_inside_the_step_is_a_late_arrival():
    """Rank 1 sleeps 0.12 s before its all-reduce: device idle time in no phase (GPU time up,
    phases flat). Rank 0 waits in the all-reduce; the idle time makes rank 1 the late one."""
    comm = np.array([0.121, 0.001])
    m = matrix({"forward": np.full(2, 0.01), "backward": np.full(2, 0.02),
                "dp-allreduce": comm}, gpu=np.full(2, 0.151), wall=np.full(2, 0.152))
    times = collective_times(m, Topology(dp=2).coords())
    assert times.wait[0, 0, 2] == pytest.approx(0.12)
    assert times.idle_s[1, 0] == pytest.approx(0.12) and times.idle_s[0, 0] == 0


def test_device_start_separates_a_stall_from_finishing_early():
    """Host time without device work is either a stall before the step or slack after it.
    When the device's start of the step is known, slack after it no longer excuses a slow
    collective: ranks 2 and 3 finished early (slack), ranks 0 and 1's collective is slow."""
    comm = np.array([0.03, 0.03, 0.01, 0.01])
    gpu = 0.1 + comm
    m = matrix({"mlp": np.full(4, 0.1), "dp-allreduce": comm}, wall=np.full(4, 0.13), gpu=gpu)
    coords = Topology(dp=4).coords()
    unknown = collective_times(m, coords)
    assert unknown.wait[0, 0, 1] == pytest.approx(0.02)  # slack could have been a stall
    device = m.host_ns.copy()  # every device started with its host: no stall before
    known = collective_times(m, coords, device)
    np.testing.assert_allclose(known.wait[:, 0, 1], 0.0, atol=1e-9)


def test_time_most_members_spend_in_no_phase_does_not_make_the_rest_waiters():
    """Where the device's start is unknown, time in no phase that most of a group spends
    (ranks 1-3 finished early: an asymmetric transfer, as under a degraded leaf switch) is
    the group's common time, not a late arrival: rank 0's long collective is transfer. One
    member's own stall (beyond what most spend) stays a late arrival (the test above)."""
    comm = np.array([0.03, 0.01, 0.01, 0.01])
    m = matrix({"mlp": np.full(4, 0.1), "dp-allreduce": comm}, wall=np.full(4, 0.13),
               gpu=0.1 + comm)
    times = collective_times(m, Topology(dp=4).coords())
    np.testing.assert_allclose(times.wait[:, 0, 1], 0.0, atol=1e-9)
    np.testing.assert_allclose(times.transfer[:, 0, 1], comm)


def test_the_scorer_reads_an_asymmetric_transfer_from_window_medians():
    """The scorer's L2 on window medians (no device time, no device start): two of eight
    members' all-reduce 3x longer while the other six spend the difference after it (in no
    phase) is those two's slow transfer, not their waiting; one member's stall before the
    all-reduce still makes the other seven waiters."""
    from argus_core.score.core_adapter import judge_phases
    from argus_core.score.snapshot import PhaseTable

    coords = Topology(dp=8).coords()
    names = ["mlp", "dp-allreduce"]
    comm = np.array([0.01] * 6 + [0.03] * 2)
    values = np.column_stack([np.full(8, 0.1), comm])
    wall = np.full(8, 0.135)
    table = PhaseTable(np.arange(8), names, values, coords, wall, minimum=values * [1, 0.97])
    found = {(f.rank, f.phase, f.kind) for f in judge_phases(table).findings}
    assert found == {(6, "dp-allreduce", "communication"), (7, "dp-allreduce", "communication")}
    late = np.array([0.03] * 7 + [0.01])  # rank 7 stalled 0.02 s before the all-reduce
    values = np.column_stack([np.full(8, 0.1), late])
    table = PhaseTable(np.arange(8), names, values, coords, wall, minimum=values * [1, 0.97])
    assert not judge_phases(table).findings

def test_collectives_are_grouped_by_their_axis():
    """tp-comm waits are judged within tp groups only: a late rank in one tp group does not
    make the other group's ranks waiters."""
    mlp = np.array([0.1, 0.1, 0.1, 0.3])  # tp groups {0, 1} and {2, 3}
    comm = np.array([0.01, 0.01, 0.21, 0.01])
    times = collective_times(matrix({"mlp": mlp, "tp-comm": comm}), Topology(tp=2, dp=2).coords())
    np.testing.assert_allclose(times.wait[:, 0, 1], [0, 0, 0.2, 0], atol=1e-9)
