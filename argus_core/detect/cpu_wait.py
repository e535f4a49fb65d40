"""Ranks short of CPU: a slow rank whose training thread waited for a CPU longer than its peers'.

A rank whose thread is runnable but not running (another process on its cores, more busy
threads than cores, a noisy neighbour) is slow without being slow at its own work: its phases
stretch, on a CPU job and on a launch-bound GPU job alike, and L2 sees compute. The exporters
record how long the thread that closes each step waited for a CPU during it (``cpu_wait_s``,
Linux's run delay). Per rank, ``d_t`` = its wait at step t minus the median wait of the other
ranks at t (a pair: its partner's); a compute verdict whose median ``d`` over its steps is at
least ``min_share`` of what it costs the job a step is a host verdict instead. The scorer,
which sees each rank's window median wait (``argus_step_cpu_wait_window_seconds``), takes the
rank's median minus the median of the other ranks' (``extra_window_cpu_wait``).

A culprit of an L1 regression (a rank whose own time rose from before the regression more
than the other ranks' did; in a one-rank job, its own rise) is judged against the same
reference: its wait's rise from before the regression beyond the other ranks' rise
(``cpu_wait_rise``: medians over the regression's steps and over the steps before).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.stats.robust import nanmedian

MIN_STEPS = 3  # steps with a recorded wait on the rank and its peers before it is judged


@dataclass(frozen=True)
class CpuWaitConfig:
    """When waiting for a CPU explains a slow rank (the default is the documented one)."""

    min_share: float = 0.5  # its extra wait is at least this share of the verdict's cost


def extra_cpu_wait(matrix: StepMatrix, rank: int, from_step: int | None = None,
                   ) -> float | None:
    """Seconds a step ``rank``'s training thread waited for a CPU beyond the other ranks'
    (median over its steps from ``from_step``); None where too few steps carry the wait."""
    waits = matrix.cpu_wait
    if waits is None or len(matrix.ranks) < 2:
        return None
    where = np.flatnonzero(matrix.ranks == rank)
    if not len(where):
        return None
    row = int(where[0])
    columns = (matrix.steps >= from_step) if from_step is not None else np.ones(
        len(matrix.steps), dtype=bool)
    own = waits[row, columns]
    others = np.delete(waits, row, axis=0)[:, columns]
    if not others.size:
        return None
    d = own - nanmedian(others, axis=0)
    d = d[~np.isnan(d)]
    return float(np.median(d)) if len(d) >= MIN_STEPS else None


def extra_window_cpu_wait(medians: dict[int, float], rank: int) -> float | None:
    """Seconds a step ``rank`` waited for a CPU beyond the other ranks' (window medians: its
    own minus the median of theirs); None where it or every other rank has none."""
    own = medians.get(rank)
    others = [wait for other, wait in medians.items() if other != rank]
    if own is None or not others:
        return None
    return float(own - np.median(others))


def cpu_wait_rise(matrix: StepMatrix, rank: int, first_step: int,
                  last_step: int | None = None) -> float | None:
    """Seconds a step by which ``rank``'s wait for a CPU rose over steps ``first_step`` to
    ``last_step`` from its own wait before ``first_step`` (medians of each), beyond the other
    ranks' rise over the same steps (their median; none in a one-rank job), as L1 measures a
    culprit's rise; None where the rank has fewer than ``MIN_STEPS`` steps carrying the wait
    on either side."""
    waits = matrix.cpu_wait
    where = np.flatnonzero(matrix.ranks == rank)
    if waits is None or not len(where):
        return None
    steps = matrix.steps
    during = (steps >= first_step) & ((steps <= last_step) if last_step is not None else True)
    before = steps < first_step
    row = int(where[0])
    if (np.count_nonzero(~np.isnan(waits[row, during])) < MIN_STEPS
            or np.count_nonzero(~np.isnan(waits[row, before])) < MIN_STEPS):
        return None
    with np.errstate(all="ignore"):
        rises = nanmedian(waits[:, during], axis=1) - nanmedian(waits[:, before], axis=1)
    others = np.delete(rises, row)
    others = others[~np.isnan(others)]
    return float(rises[row] - (np.median(others) if len(others) else 0.0))
