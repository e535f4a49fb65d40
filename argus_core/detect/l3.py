"""L3: degraded kernels, by directional Wasserstein-1 over compressed distributions.

For every (peer set, kernel, stream, window) "unit", each rank's duration distribution is
rebuilt from its cluster summaries (a log-normal mixture), evaluated on a log-spaced grid shared
by the unit. The reference is the pointwise 0.75 order statistic of the ranks' CDFs: a valid
CDF that sits among the faster healthy ranks as long as at most half of the unit is degraded, so a
degraded half (the paper's case 2) cannot drag the reference with it. A rank's score is the
W1 mass by which it is slower than the reference, over the reference's mean: 0.5 means this
kernel costs that rank 50% more time than its healthy peers. Flags need a score above both an
absolute floor and a fence estimated from the faster half of the unit's scores, with a
Bonferroni factor so healthy units do not produce more false alarms as they grow.

Cost is O(N x M) per unit (N ranks, M grid points) after grouping; units of equal size are
stacked and processed in bounded-memory chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.stats.grouping import dense_ids
from argus_core.stats.mixture import lognormal_params, mixture_cdf
from argus_core.stats.robust import family_z, lower_half_fence
from argus_core.stats.wasserstein import excess_w1, mean_from_cdf, trapezoid_weights
from argus_core.summaries import KernelSummary

_CHUNK_CELLS = 4_000_000  # grid cells (ranks x grid points) evaluated per chunk


@dataclass(frozen=True)
class L3Config:
    """Thresholds of the kernel-level comparison."""

    grid_points: int = 128
    reference_quantile: float = 0.75  # pointwise CDF quantile across peers
    min_score: float = 0.15  # at least 15% more time on this kernel than healthy peers
    min_peers: int = 3
    alpha: float = 0.01  # family-wise false-alarm rate per unit


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
    fence: np.ndarray
    flagged: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.rank)


def score_kernels(summary: KernelSummary, peer_set_of_rank: np.ndarray | None = None,
                  config: L3Config | None = None) -> KernelScores:
    """Score every rank of every unit; ``peer_set_of_rank[r]`` groups ranks doing the same work."""
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
    excess = np.full(n_rows, np.nan)
    fence = np.full(n_rows, np.nan)
    lin = np.linspace(0.0, 1.0, config.grid_points)
    for size in np.unique(unit_size[unit_size >= config.min_peers]).tolist():
        units = np.flatnonzero(unit_size == size)
        per_chunk = max(1, _CHUNK_CELLS // (size * config.grid_points))
        z = family_z(size, config.alpha)
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
            score[rows] = rel.ravel()
            excess[rows] = (rel * ref_mean[:, None]).ravel()
            fence[rows] = np.repeat(lower_half_fence(rel, z), size)
    flagged = np.nan_to_num(score) > np.maximum(np.nan_to_num(fence, nan=np.inf),
                                                config.min_score)
    return KernelScores(rank=row_rank, kernel=u_kernel[row_unit], stream=u_stream[row_unit],
                        window=u_window[row_unit], peer_set=u_peer[row_unit], score=score,
                        excess_ns=excess, executions=np.bincount(comp_row, weight, n_rows),
                        fence=fence, flagged=flagged, names=summary.names)


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
