"""Benchmark: L3 scoring time at cluster scale, its growth with ranks, precision and recall.

    python bench/score.py [--ranks 10000] [--kernels 100] [--json]

Scores synthetic compressed summaries for 1,000 .. --ranks ranks in one peer group (best of
3 runs per size) and fits the growth exponent of time with ranks. The data has the
heterogeneity healthy ranks show (2% persistent speed spread, 5% jitter of every cluster's
count and spread) and --planted ranks 1.25x slower on every kernel; precision and recall of
the flagged ranks are printed next to the time.

Baseline, timed in the same run on the same data: the paper's score, the mean W1 of each
rank to all its peers computed in O(M N log N) (``stats/wasserstein.mean_w1_to_peers``: sorted
CDF columns and prefix sums, not a pairwise loop), with the paper's IQR fence (Q3 + 1.5 IQR)
per kernel, on the same grid CDFs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _report import report

from argus_core.detect.l3 import score_kernels
from argus_core.simulate.summaries import synthetic_summaries
from argus_core.stats.mixture import lognormal_params, mixture_cdf
from argus_core.stats.wasserstein import mean_w1_to_peers, trapezoid_weights

HETEROGENEITY = dict(rank_spread=0.02, count_jitter=0.05, spread_jitter=0.05)


def workload(ranks: int, kernels: int, planted: int, seed: int):
    """Summaries with ``planted`` ranks 1.25x slower; returns (summary, planted ranks)."""
    rng = np.random.default_rng(seed)
    slow = {int(r): 1.25 for r in rng.choice(ranks, planted, replace=False)}
    return synthetic_summaries(ranks, kernels, slow=slow, seed=seed, **HETEROGENEITY), set(slow)


def precision_recall(found: set[int], planted: set[int]) -> tuple[float, float]:
    """Share of flagged ranks that were planted, and of planted ranks that were flagged."""
    hits = len(found & planted)
    return (hits / len(found) if found else 1.0), hits / len(planted)


def timed_score(summary, repeats: int = 3) -> tuple[float, set[int]]:
    """Best-of-``repeats`` seconds of ``score_kernels`` and the ranks it flagged."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        scores = score_kernels(summary)
        best = min(best, time.perf_counter() - t0)
    return best, set(scores.rank[scores.flagged].tolist())


def baseline(summary, kernels: int, grid: int = 128) -> tuple[float, set[int]]:
    """Seconds and flagged ranks of mean-W1-to-peers + Q3+1.5 IQR, kernel by kernel."""
    lin = np.linspace(0.0, 1.0, grid)
    flagged: set[int] = set()
    t0 = time.perf_counter()
    for k in range(kernels):
        rows = np.flatnonzero(summary.kernel == k)
        mu, sigma = lognormal_params(summary.p50_ns[rows], summary.p99_ns[rows])
        lo, hi = float((mu - 4 * sigma).min()), float((mu + 4 * sigma).max())
        ranks, local = np.unique(summary.rank[rows], return_inverse=True)
        cdf = mixture_cdf(lin, np.full(len(mu), lo), np.full(len(mu), hi - lo), local,
                          summary.count[rows].astype(float), mu, sigma,
                          len(ranks)).astype(np.float64)
        score = mean_w1_to_peers(cdf, trapezoid_weights(np.exp(lo + (hi - lo) * lin)))
        q1, q3 = np.quantile(score, [0.25, 0.75])
        flagged |= set(ranks[score > q3 + 1.5 * (q3 - q1)].tolist())
    return time.perf_counter() - t0, flagged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--planted", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    sizes = sorted({n for n in (1000, 2000, 5000, args.ranks) if n <= args.ranks})
    times, precision, recall = {}, {}, {}
    for n in sizes:
        summary, planted = workload(n, args.kernels, args.planted, seed=n)
        times[n], found = timed_score(summary)
        precision[n], recall[n] = precision_recall(found, planted)
    exponent = float(np.polyfit(np.log(sizes), np.log([times[n] for n in sizes]), 1)[0]) \
        if len(sizes) > 1 else float("nan")
    summary, planted = workload(args.ranks, args.kernels, args.planted, seed=args.ranks)
    base_s, base_found = baseline(summary, args.kernels)
    base_precision, base_recall = precision_recall(base_found, planted)
    result = {"ranks": args.ranks, "kernels": args.kernels, "seconds": times[args.ranks],
              "exponent": exponent, "precision": precision[args.ranks],
              "recall": recall[args.ranks],
              "seconds_by_ranks": {str(k): round(v, 3) for k, v in times.items()},
              "precision_by_ranks": {str(k): round(v, 3) for k, v in precision.items()},
              "recall_by_ranks": {str(k): round(v, 3) for k, v in recall.items()},
              "baseline": "mean W1 to peers, O(M N log N), + Q3+1.5 IQR fence",
              "baseline_seconds": base_s, "baseline_precision": base_precision,
              "baseline_recall": base_recall, "baseline_flagged": len(base_found),
              "time_ratio_to_baseline": times[args.ranks] / base_s}
    report(result, args.json)


if __name__ == "__main__":
    main()
