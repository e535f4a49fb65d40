"""Synthetic kernel summaries at cluster scale, for exercising the L3 scoring job directly.

Simulating 10,000 ranks kernel by kernel is pointless when the scoring job only ever sees
compressed summaries; this builds those summaries directly: two clusters per (rank, kernel)
(a fast and a 5x slower mode, as compression emits for bimodal kernels), per-rank speed
differences, and optional slowdowns. ``count_jitter`` and ``spread_jitter`` add what MoE
routing and GPU bins give healthy ranks: per-cluster execution counts and spreads that vary
from rank to rank.
"""

from __future__ import annotations

import numpy as np

from argus_core.summaries import KernelSummary


def synthetic_summaries(n_ranks: int, n_kernels: int = 4, slow: dict[int, float] | None = None,
                        seed: int = 0, rank_spread: float = 0.01,
                        tail: dict[int, tuple[float, float]] | None = None,
                        count_jitter: float = 0.0, spread_jitter: float = 0.0,
                        slow_mode_share: dict[int, float] | None = None) -> KernelSummary:
    """Summaries of one 60 s window.

    ``slow[rank]`` scales a rank's durations; ``tail[rank] = (fraction, slowdown)`` adds a slow
    third cluster to the rank's slower mode; ``slow_mode_share[rank]`` multiplies the rank's
    executions of the slower mode (more slow-mode work, as routing can give a rank).
    ``count_jitter`` and ``spread_jitter`` are log-normal sds of each cluster's count and of
    its p99/p50 ratio.
    """
    rng = np.random.default_rng(seed)
    rows = n_ranks * n_kernels * 2
    rank = np.repeat(np.arange(n_ranks), n_kernels * 2)
    kernel = np.tile(np.repeat(np.arange(n_kernels), 2), n_ranks)
    cluster = np.tile([0, 1], n_ranks * n_kernels)
    base = np.exp(rng.uniform(8, 16, n_kernels))[kernel] * np.where(cluster == 1, 5.0, 1.0)
    speed = np.exp(rng.normal(0, rank_spread, n_ranks))[rank]
    p50 = base * speed * np.exp(rng.normal(0, 0.005, rows))
    ratio = 1.3 * np.exp(rng.normal(0, 0.02, rows))
    if spread_jitter:
        ratio = 1 + (ratio - 1) * np.exp(rng.normal(0, spread_jitter, rows))
    p99 = p50 * ratio
    count = np.tile(rng.integers(50, 200, n_kernels * 2), n_ranks).astype(np.float64)
    if count_jitter:
        count *= np.exp(rng.normal(0, count_jitter, rows))
    for r, share in (slow_mode_share or {}).items():
        count[(rank == r) & (cluster == 1)] *= share
    count = np.maximum(np.round(count), 1).astype(np.int64)
    for r, factor in (slow or {}).items():
        p50[rank == r] *= factor
        p99[rank == r] *= factor
    columns = [rank, kernel, cluster, count, p50, p99]
    for r, (fraction, slowdown) in (tail or {}).items():
        sel = np.flatnonzero((rank == r) & (cluster == 1))
        extra = [rank[sel], kernel[sel], np.full(len(sel), 2), (count[sel] * fraction).astype(
            np.int64), p50[sel] * slowdown, p50[sel] * slowdown * 1.2]
        columns = [np.r_[a, b] for a, b in zip(columns, extra, strict=True)]
    rank, kernel, cluster, count, p50, p99 = columns
    n = len(rank)
    return KernelSummary(rank, kernel, np.full(n, 7), np.zeros(n, dtype=np.int64), cluster,
                         count, p50 * count, p50, p99, [f"kernel_{i}" for i in range(n_kernels)],
                         60_000_000_000)
