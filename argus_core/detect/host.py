"""Sustained host stragglers: ranks whose host time, step after step, exceeds the other ranks'.

A rank that stalls on the host before every step (a slow data loader, a busy core, Python work
between steps) makes every other rank wait inside its first collective, so no phase of its own
is slow and its iteration time is the job's: L1 sees no change when the stall is there from the
start, and L2's phases show only its peers waiting. What is its own is its host time: wall -
device time before the step's device work (``argus_core.detect.arrival``; all of wall - device
time where the device's start is unknown) plus device time in no phase.

Per rank, ``d_t`` = its host time at step t minus the median host time of all ranks at t
(a pair: its partner's), over the judged steps. A rank is flagged when the median of ``d`` is
at least ``min_share`` of the job's median step, and significant: its z against
``sqrt(se^2 + pooled^2)`` reaches the family-wise z of L2, where se is the standard error of
the median from the series' step-to-step noise (widened by Student's t) and ``pooled`` the MAD
of every rank's median (from ``min_pool`` ranks on): the healthy ranks calibrate it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.arrival import CollectiveTimes
from argus_core.detect.steps import StepMatrix
from argus_core.stats.changepoint import row_noise
from argus_core.stats.robust import family_z, mad_sigma, nanmedian, t_widening


@dataclass(frozen=True)
class HostConfig:
    """Thresholds of the host comparison (defaults are the documented ones)."""

    min_share: float = 0.05  # host excess of at least 5% of the job's median step
    alpha: float = 0.002  # expected falsely flagged ranks per job
    z_threshold: float = 4.0
    min_pool: int = 8  # ranks needed before their pooled MAD is trusted


@dataclass(frozen=True)
class HostFinding:
    """A rank whose host time exceeds the other ranks' on the judged steps."""

    rank: int
    excess_s: float  # extra host time per step, median over the judged steps
    share: float  # excess over the job's median step
    z: float


def detect_host(matrix: StepMatrix, times: CollectiveTimes, steady: np.ndarray,
                step_s: float, config: HostConfig | None = None) -> list[HostFinding]:
    """Ranks whose host time exceeds the others' on the ``steady`` steps (see module doc)."""
    config = config or HostConfig()
    n_ranks, n_steps = len(matrix.ranks), int(steady.sum())
    if n_ranks < 2 or n_steps < 3 or not step_s > 0:
        return []
    host = np.where(np.isnan(matrix.wall), np.nan, times.own_host_s + times.idle_s)[:, steady]
    ref = host[::-1] if n_ranks == 2 else nanmedian(host, axis=0)[None, :]
    d = host - ref
    valid = ~np.isnan(d)
    median = nanmedian(d, axis=1)
    used = np.maximum(valid.sum(axis=1), 2)
    noise = row_noise(np.where(valid, d, np.nan_to_num(median)[:, None]),
                      floor=1e-6)
    p_family = config.alpha / n_ranks
    se = 1.2533 * noise * t_widening(used - 1, p_family) / np.sqrt(used)
    finite = median[np.isfinite(median)]
    pooled = float(mad_sigma(finite)) if len(finite) >= config.min_pool else 0.0
    sigma = np.sqrt(se ** 2 + pooled ** 2)
    z_family = max(config.z_threshold, family_z(n_ranks, config.alpha))
    with np.errstate(all="ignore"):
        z = median / sigma
    share = median / step_s
    hit = np.isfinite(z) & (z >= z_family) & (share >= config.min_share)
    return [HostFinding(int(matrix.ranks[i]), float(median[i]), float(share[i]),
                        float(min(z[i], 1e6))) for i in np.flatnonzero(hit)]
