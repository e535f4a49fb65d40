"""L3: degraded kernels, by directional Wasserstein-1 over compressed distributions.

For every (peer set, kernel, stream, window) "unit", each rank's duration distribution is
rebuilt from its cluster summaries (a log-normal mixture), evaluated on a log-spaced grid shared
by the unit. The reference is the pointwise 0.75 order statistic of the ranks' CDFs: a valid
CDF that sits among the faster healthy ranks as long as at most half of the unit is degraded, so
a degraded half (the paper's case 2) cannot drag the reference with it.

Two numbers per (unit, rank), both relative to the reference's mean time:

- ``score``: the W1 mass by which the rank is *slower* than the reference (directional, so a
  fattened tail counts even when the median has not moved; +0.5 = this kernel costs the rank
  50% more time than its healthy peers);
- ``signed``: the signed W1, mean(rank) - mean(reference), which healthy ranks scatter around
  symmetrically; the fences are calibrated on it.

Fences are calibrated on the healthy majority and corrected for the number of tests, so the
expected number of falsely flagged ranks per job does not grow with ranks, kernels or natural
heterogeneity (rank speed spread, MoE count jitter):

1. Per unit, centre and spread of ``signed`` over its healthy ranks
   (``stats.robust.healthy_centre_spread``: the median and interquartile spread, or, when the
   upper part of the unit is far out, from its faster half only, so that a degraded half
   cannot widen the fence). The spread is never below the kernel's typical spread (its
   residuals pooled over every peer set and window: a unit of few ranks cannot estimate it
   alone) nor ``scale_floor``.
2. A (rank, kernel) row is flagged when ``score >= min_score``, it is ``min_score`` above the
   unit's centre, and its z exceeds ``Phi^-1(1 - alpha / N)``, N = every (unit, rank) scored
   (Bonferroni). A row's spread is also never below its sampling error: the unit's typical
   relative sd (the median over its ranks of each mixture's sd over its mean: a rank's own
   degradation, a fattened tail, never widens its own fence) / sqrt(samples), samples = the
   row's executions but at most the window's steps,
   widened by Student's t: a kernel run a handful of times per window cannot be called
   slow on its own).
3. Each rank is also judged on all its kernels together: its time-weighted mean ``signed``
   over the kernels of a peer set and window (weights: the reference's time per step) is
   calibrated the same way across the ranks of that peer set, with N = the number of ranks
   judged. A rank over that fence and ``min_score`` has its kernels flagged whose score passes
   ``min_score`` and whose z passes the family-wise threshold for its own kernels only.

Cost is O(N x M) per unit (N ranks, M grid points) after grouping; units of equal size are
stacked and processed in bounded-memory chunks.

The summary-level entry point for a scoring job holding only (count, p50, p99) per cluster is
``score_kernels(summary, peer_set_of_rank, config)``: ``flagged`` marks the (rank, kernel,
stream) rows found, with their ``score``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from argus_core.stats.grouping import dense_ids
from argus_core.stats.mixture import lognormal_params, mixture_cdf
from argus_core.stats.robust import (
    centre_spread,
    family_z,
    healthy_centre_spread,
    t_widening,
)
from argus_core.stats.wasserstein import excess_w1, mean_from_cdf, trapezoid_weights
from argus_core.summaries import KernelSummary

_CHUNK_CELLS = 4_000_000  # grid cells (ranks x grid points) evaluated per chunk


@dataclass(frozen=True)
class L3Config:
    """Thresholds of the kernel-level comparison."""

    grid_points: int = 128
    reference_quantile: float = 0.75  # pointwise CDF quantile across peers
    min_score: float = 0.1  # at least 10% more time on this kernel than healthy peers
    min_peers: int = 3
    alpha: float = 0.002  # expected falsely flagged rows (and ranks) per job
    scale_floor: float = 0.02  # spread of the signed score never assumed below 2%


@dataclass
class KernelScores:
    """One row per (unit, rank): the rank's score against its unit's healthy reference."""

    rank: np.ndarray
    kernel: np.ndarray
    stream: np.ndarray
    window: np.ndarray
    peer_set: np.ndarray
    score: np.ndarray  # NaN where the unit had fewer than min_peers ranks
    excess_ns: np.ndarray  # the same W1 excess in ns per execution (score x reference mean)
    executions: np.ndarray  # executions of the kernel by the rank in the window
    fence: np.ndarray  # the signed score above which this row would be flagged
    flagged: np.ndarray
    names: list[str]
    signed: np.ndarray | None = None  # (mean - reference mean) / reference mean
    z: np.ndarray | None = None  # the row's z against its unit's healthy spread
    rank_z: np.ndarray | None = None  # its rank's z over all its kernels (same peer set)
    rank_score: np.ndarray | None = None  # its rank's time-weighted mean signed score, over
    # the typical healthy rank of its peer set (0 = typical, 0.25 = 25% slower)

    def __len__(self) -> int:
        return len(self.rank)


def score_kernels(summary: KernelSummary, peer_set_of_rank: np.ndarray | None = None,
                  config: L3Config | None = None,
                  steps_per_window: np.ndarray | None = None,
                  family_scale: float = 1.0) -> KernelScores:
    """Score every rank of every unit; ``flagged`` marks the slow (rank, kernel, stream) rows.

    ``peer_set_of_rank[r]`` groups ranks doing the same work (e.g. their pipeline stage;
    all ranks alike when None). ``steps_per_window[w]`` (optional) is how many training steps
    window w holds: executions within a step share its conditions (MoE routing, host load),
    so a row's mean has no more independent samples than steps. This is the entry point for a
    scoring job that only holds (count, p50, p99) per cluster. ``family_scale``: the job's
    tests over those in ``summary`` (a scorer shard holding some peer sets of a job): the
    family-wise thresholds are then the whole job's.
    """
    config = config or L3Config()
    if peer_set_of_rank is None:
        peer = np.zeros(len(summary), dtype=np.int64)
    else:
        peer = np.asarray(peer_set_of_rank, dtype=np.int64)[summary.rank]
    unit, (u_peer, u_kernel, u_stream, u_window) = dense_ids(
        peer, summary.kernel, summary.stream, summary.window)
    row, (row_unit, row_rank) = dense_ids(unit, summary.rank)
    n_rows, n_units = len(row_unit), len(u_peer)

    order = np.argsort(row, kind="stable")
    comp_row = row[order]
    mu, sigma = lognormal_params(summary.p50_ns[order], summary.p99_ns[order])
    weight = summary.count[order].astype(np.float64)
    comp_start = np.searchsorted(comp_row, np.arange(n_rows + 1))
    comp_unit = row_unit[comp_row]
    lo = np.full(n_units, np.inf)
    hi = np.full(n_units, -np.inf)
    np.minimum.at(lo, comp_unit, mu - 4 * sigma)
    np.maximum.at(hi, comp_unit, mu + 4 * sigma)

    unit_size = np.bincount(row_unit, minlength=n_units)
    unit_first_row = np.searchsorted(row_unit, np.arange(n_units))
    score = np.full(n_rows, np.nan)
    signed = np.full(n_rows, np.nan)
    ref_time = np.full(n_rows, np.nan)  # the reference's mean, ns per execution
    quartiles = np.full((4, n_units), np.nan)  # 5th, 25th, 50th, 75th percentile of signed
    lin = np.linspace(0.0, 1.0, config.grid_points)
    for size in np.unique(unit_size[unit_size >= config.min_peers]).tolist():
        units = np.flatnonzero(unit_size == size)
        per_chunk = max(1, _CHUNK_CELLS // (size * config.grid_points))
        for first in range(0, len(units), per_chunk):
            chunk = units[first:first + per_chunk]
            rows = (unit_first_row[chunk][:, None] + np.arange(size)).ravel()
            cdf = _row_cdfs(rows, size, lo[chunk], (hi - lo)[chunk], lin, comp_start, weight,
                            mu, sigma).reshape(len(chunk), size, config.grid_points)
            kth = int(np.ceil(config.reference_quantile * (size - 1)))
            # Partition along a contiguous axis: a strided one thrashes the cache at large N.
            by_point = np.ascontiguousarray(cdf.transpose(0, 2, 1))
            ref = np.partition(by_point, kth, axis=2)[:, :, kth]
            t = np.exp(lo[chunk][:, None] + (hi - lo)[chunk][:, None] * lin)
            weights = trapezoid_weights(t)
            ref_mean = mean_from_cdf(ref.astype(np.float64), t, weights)
            rel = excess_w1(cdf, ref, weights.astype(np.float32)) / ref_mean[:, None]
            mean = mean_from_cdf(cdf, t[:, None, :].astype(np.float32),
                                 weights[:, None, :].astype(np.float32))
            shift = mean / ref_mean[:, None] - 1.0
            score[rows] = rel.ravel()
            signed[rows] = shift.ravel()
            ref_time[rows] = np.repeat(ref_mean, size)
            quartiles[:, chunk] = np.quantile(shift, [0.05, 0.25, 0.5, 0.75], axis=-1)

    executions = np.bincount(comp_row, weight, n_rows)
    scored = np.isfinite(signed)
    typical = np.maximum(_pooled_spread(signed - quartiles[2][row_unit], scored,
                                        u_kernel[row_unit], u_stream[row_unit], row_unit,
                                        n_units), config.scale_floor)
    centre, spread = centre_spread(*quartiles, typical=typical)
    # A row of few executions has a noisy mean of its own: its sampling error, from its
    # mixture's variance, widened by Student's t since that variance comes from those few.
    n_tests = int(scored.sum())
    samples = executions
    if steps_per_window is not None:
        steps = np.asarray(steps_per_window, dtype=np.float64)
        samples = np.minimum(executions, steps[np.clip(u_window[row_unit], 0, len(steps) - 1)])
    spread_cv = _unit_median(_relative_sd(comp_row, n_rows, weight, mu, sigma), row_unit,
                             n_units)[row_unit]
    sampling = spread_cv / np.sqrt(np.maximum(samples, 1.0)) * t_widening(
        np.maximum(samples - 1, 1), config.alpha / max(n_tests * family_scale, 1))
    row_spread = np.maximum(spread[row_unit], np.hypot(config.scale_floor, sampling))
    z = (signed - centre[row_unit]) / row_spread
    z_rows = family_z(round(n_tests * family_scale), config.alpha)
    fence = centre[row_unit] + z_rows * row_spread
    above_typical = signed - centre[row_unit]  # extra time over the typical healthy rank
    flagged = scored & (z >= z_rows) & (score >= config.min_score) & (
        above_typical >= config.min_score)

    rank_score, rank_z = _rank_level(row_rank, u_peer[row_unit], u_window[row_unit],
                                     row_unit, signed, ref_time, executions, config)
    judged_ranks = np.isfinite(rank_z)
    if judged_ranks.any():
        z_ranks = family_z(round(family_scale * _count_ranks(
            row_rank, u_peer[row_unit], u_window[row_unit], judged_ranks)), config.alpha)
        slow_rank = (rank_z >= z_ranks) & (rank_score >= config.min_score)
        if slow_rank.any():
            kernels_per_rank = np.bincount(row_rank[scored]).astype(float)
            z_own = np.array([family_z(int(k), config.alpha) if k else np.inf
                              for k in kernels_per_rank])
            own = slow_rank & (z >= z_own[row_rank]) & (score >= config.min_score)
            flagged |= own
    return KernelScores(rank=row_rank, kernel=u_kernel[row_unit], stream=u_stream[row_unit],
                        window=u_window[row_unit], peer_set=u_peer[row_unit], score=score,
                        excess_ns=score * ref_time, executions=executions, fence=fence,
                        flagged=flagged, names=summary.names, signed=signed, z=z,
                        rank_z=rank_z, rank_score=rank_score)


def _relative_sd(comp_row: np.ndarray, n_rows: int, weight: np.ndarray, mu: np.ndarray,
                 sigma: np.ndarray) -> np.ndarray:
    """Each row's relative spread of durations: the sd of its log-normal mixture over its
    mean."""
    first = np.exp(mu + sigma ** 2 / 2)  # each component's mean and second moment
    second = np.exp(2 * mu + 2 * sigma ** 2)
    total = np.maximum(np.bincount(comp_row, weight, n_rows), 1e-300)
    mean = np.bincount(comp_row, weight * first, n_rows) / total
    var = np.maximum(np.bincount(comp_row, weight * second, n_rows) / total - mean ** 2, 0.0)
    return np.sqrt(var) / np.maximum(mean, 1e-300)


def _unit_median(values: np.ndarray, row_unit: np.ndarray, n_units: int) -> np.ndarray:
    """Per unit, the (lower) median of its rows' values (rows are sorted by unit)."""
    order = np.lexsort((values, row_unit))
    size = np.bincount(row_unit, minlength=n_units)
    first = np.r_[0, np.cumsum(size)[:-1]]
    out = np.full(n_units, np.nan)
    has = size > 0
    out[has] = values[order][first[has] + (size[has] - 1) // 2]
    return out


def _pooled_spread(residual: np.ndarray, scored: np.ndarray, kernel: np.ndarray,
                   stream: np.ndarray, unit: np.ndarray, n_units: int) -> np.ndarray:
    """Per unit: the spread of its kernel's residuals (signed - unit centre) pooled over every
    peer set and window. A unit of a few ranks cannot estimate its spread; the same kernel
    elsewhere in the job has the same noise (its execution counts, MoE jitter)."""
    out = np.zeros(n_units)
    if not scored.any():
        return out
    pool, _ = dense_ids(kernel[scored], stream[scored])
    values, units = residual[scored], unit[scored]
    order = np.argsort(pool, kind="stable")
    bounds = np.flatnonzero(np.r_[True, pool[order][1:] != pool[order][:-1], True])
    for lo, hi in itertools.pairwise(bounds):
        rows = order[lo:hi]
        if len(rows) < 8:
            continue
        _, spread = healthy_centre_spread(values[rows][None, :])
        out[np.unique(units[rows])] = float(spread[0])
    return out


def _rank_level(rank: np.ndarray, peer: np.ndarray, window: np.ndarray, unit: np.ndarray,
                signed: np.ndarray, ref_time: np.ndarray, executions: np.ndarray,
                config: L3Config) -> tuple[np.ndarray, np.ndarray]:
    """Per row: its rank's time-weighted mean signed score over the kernels of the same peer
    set and window, less the typical rank's, and that score's z against the other ranks of
    the peer set."""
    scored = np.isfinite(signed)
    combo, (c_peer, c_window, _c_rank) = dense_ids(peer, window, rank)
    typical = np.zeros(int(unit.max()) + 1 if len(unit) else 0)
    if len(unit):  # the unit's median executions: a rank's own count does not weigh itself
        order = np.argsort(unit, kind="stable")
        starts = np.flatnonzero(np.r_[True, unit[order][1:] != unit[order][:-1]])
        sizes = np.diff(np.r_[starts, len(order)])
        for size in np.unique(sizes).tolist():
            which = np.flatnonzero(sizes == size)
            idx = order[starts[which][:, None] + np.arange(size)]
            typical[unit[idx[:, 0]]] = np.median(executions[idx], axis=1)
    w = np.where(scored, np.nan_to_num(ref_time) * typical[unit], 0.0)
    total = np.bincount(combo, w)
    mean = np.bincount(combo, w * np.nan_to_num(signed)) / np.where(total > 0, total, 1.0)
    mean[total <= 0] = np.nan
    z = np.full(len(mean), np.nan)
    set_of_combo, _ = dense_ids(c_peer, c_window)
    order = np.argsort(set_of_combo, kind="stable")
    bounds = np.flatnonzero(np.r_[True, set_of_combo[order][1:] != set_of_combo[order][:-1]])
    rows = []
    for lo, hi in zip(bounds, np.r_[bounds[1:], len(order)], strict=True):
        members = order[lo:hi]
        ok = np.isfinite(mean[members])
        if ok.sum() >= config.min_peers:
            rows.append(members[ok])
    # Peer sets of a few ranks cannot estimate their spread: pool the job's residuals.
    residual = np.concatenate([mean[m] - np.median(mean[m]) for m in rows]) if rows else []
    typical = config.scale_floor
    if len(residual) >= 8:
        typical = max(float(healthy_centre_spread(np.asarray(residual)[None, :])[1][0]),
                      config.scale_floor)
    for members in rows:
        centre, spread = healthy_centre_spread(mean[members][None, :], typical=typical)
        z[members] = (mean[members] - centre[0]) / spread[0]
        mean[members] -= centre[0]
    return mean[combo], z[combo]


def _count_ranks(rank: np.ndarray, peer: np.ndarray, window: np.ndarray,
                 judged: np.ndarray) -> int:
    """Distinct (rank, peer set, window) combinations judged at the rank level."""
    if not judged.any():
        return 0
    ids, _ = dense_ids(rank[judged], peer[judged], window[judged])
    return int(ids.max()) + 1


def _row_cdfs(rows: np.ndarray, size: int, lo: np.ndarray, span: np.ndarray, lin: np.ndarray,
              comp_start: np.ndarray, weight: np.ndarray, mu: np.ndarray,
              sigma: np.ndarray) -> np.ndarray:
    """Mixture CDF of each row on its unit's grid (len(rows) x M); rows come unit by unit."""
    starts, ends = comp_start[rows], comp_start[rows + 1]
    lengths = ends - starts
    offsets = np.r_[0, np.cumsum(lengths)[:-1]]
    comp = np.repeat(starts - offsets, lengths) + np.arange(lengths.sum())
    local_row = np.repeat(np.arange(len(rows)), lengths)
    unit = local_row // size
    return mixture_cdf(lin, lo[unit], span[unit], local_row, weight[comp], mu[comp], sigma[comp],
                       len(rows))
