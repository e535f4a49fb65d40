"""Benchmark: L3 scoring time at cluster scale and its growth with the number of ranks.

    python bench/score.py [--ranks 10000] [--kernels 100] [--json]

Scores synthetic compressed summaries (two clusters per rank and kernel, one rank 2x slow) for
1,000 .. --ranks ranks in one peer group (best of 3 runs per size), and fits the growth
exponent of time with ranks.
Baseline, timed in the same run: the paper's score computed pairwise (W1 between every pair of
ranks on the same grid CDFs, O(N^2 M) per kernel) on --baseline-ranks ranks and one kernel; the
ratio compares it with our scoring of the same ranks and kernel.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import report

from argus_core.detect.l3 import score_kernels
from argus_core.simulate.summaries import synthetic_summaries
from argus_core.stats.mixture import lognormal_params, mixture_cdf
from argus_core.stats.wasserstein import trapezoid_weights


def timed_score(ranks: int, kernels: int, repeats: int = 3) -> tuple[float, bool]:
    """Best-of-``repeats`` seconds to score, and whether exactly the slow rank was flagged."""
    summary = synthetic_summaries(ranks, kernels, slow={ranks // 2: 2.0}, seed=ranks)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        scores = score_kernels(summary)
        best = min(best, time.perf_counter() - t0)
    found = set(scores.rank[scores.flagged].tolist()) == {ranks // 2}
    return best, found


def pairwise_baseline(ranks: int, grid: int = 128) -> float:
    """Seconds for all-pairs mean W1 of one kernel (the straightforward O(N^2) score)."""
    s = synthetic_summaries(ranks, 1, slow={0: 2.0})
    mu, sigma = lognormal_params(s.p50_ns, s.p99_ns)
    lo, hi = (mu - 4 * sigma).min(), (mu + 4 * sigma).max()
    lin = np.linspace(0, 1, grid)
    t0 = time.perf_counter()
    cdf = mixture_cdf(lin, np.full(len(mu), lo), np.full(len(mu), hi - lo), s.rank,
                      s.count.astype(float), mu, sigma, ranks).astype(np.float64)
    weights = trapezoid_weights(np.exp(lo + (hi - lo) * lin))
    score = np.array([np.abs(cdf - cdf[i]) @ weights for i in range(ranks)]).sum(axis=1)
    score /= ranks - 1
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--baseline-ranks", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    sizes = sorted({n for n in (1000, 2000, 5000, args.ranks) if n <= args.ranks})
    times, found = {}, True
    for n in sizes:
        seconds, ok = timed_score(n, args.kernels)
        times[n] = seconds
        found &= ok
    exponent = float(np.polyfit(np.log(sizes), np.log([times[n] for n in sizes]), 1)[0]) \
        if len(sizes) > 1 else float("nan")
    base = pairwise_baseline(args.baseline_ranks)
    ours, _ = timed_score(args.baseline_ranks, 1)
    result = {"ranks": args.ranks, "kernels": args.kernels, "seconds": times[args.ranks],
              "exponent": exponent, "slow_rank_found_at_every_size": found,
              "seconds_by_ranks": {str(k): round(v, 3) for k, v in times.items()},
              "baseline_ranks": args.baseline_ranks, "baseline_pairwise_s": base,
              "ours_same_ranks_s": ours, "speedup_vs_pairwise": base / ours}
    report(result, args.json)


if __name__ == "__main__":
    main()
