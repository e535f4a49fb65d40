"""Benchmark: falsely flagged ranks per job at 10,000 ranks x 100 kernels, and recall.

    python bench/false_alarms.py [--json] [--ranks 10000] [--kernels 100] [--jobs 5]

Each job is a window of synthetic kernel summaries with the heterogeneity healthy production
ranks show: 2% persistent rank-to-rank speed spread and 5% jitter of every cluster's count
and spread (MoE routing, GPU bins). Each job has --planted ranks 1.25x slower on every kernel.
``false_ranks_per_job`` counts flagged ranks that were not planted (target < 1),
``recall`` the planted ranks found (target 1.0), averaged over --jobs seeded jobs.

Baseline, same jobs, same run: the paper's score (mean W1 of a rank to all its peers, in
O(M N log N), ``stats/wasserstein.mean_w1_to_peers``) with an uncorrected IQR fence (Q3 + 1.5
IQR) per kernel, on --baseline-kernels of the kernels.
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


def baseline_flags(summary, kernels: int, grid: int = 128) -> set[int]:
    """Ranks flagged by mean-W1-to-peers with a Q3 + 1.5 IQR fence, kernel by kernel."""
    flagged: set[int] = set()
    lin = np.linspace(0.0, 1.0, grid)
    for k in range(kernels):
        rows = np.flatnonzero(summary.kernel == k)
        rank = summary.rank[rows]
        mu, sigma = lognormal_params(summary.p50_ns[rows], summary.p99_ns[rows])
        lo, hi = float((mu - 4 * sigma).min()), float((mu + 4 * sigma).max())
        order = np.argsort(rank, kind="stable")
        ranks, local = np.unique(rank[order], return_inverse=True)
        cdf = mixture_cdf(lin, np.full(len(mu), lo), np.full(len(mu), hi - lo), local,
                          summary.count[rows][order].astype(float), mu[order], sigma[order],
                          len(ranks)).astype(np.float64)
        score = mean_w1_to_peers(cdf, trapezoid_weights(np.exp(lo + (hi - lo) * lin)))
        q1, q3 = np.quantile(score, [0.25, 0.75])
        flagged |= set(ranks[score > q3 + 1.5 * (q3 - q1)].tolist())
    return flagged


def one_job(ranks: int, kernels: int, planted: int, seed: int, baseline_kernels: int) -> dict:
    """Score one seeded job; count false flags and recall, ours and the baseline's."""
    rng = np.random.default_rng(seed)
    slow = {int(r): 1.25 for r in rng.choice(ranks, planted, replace=False)}
    summary = synthetic_summaries(ranks, kernels, slow=slow, seed=seed, **HETEROGENEITY)
    t0 = time.perf_counter()
    scores = score_kernels(summary)
    seconds = time.perf_counter() - t0
    found = set(scores.rank[scores.flagged].tolist())
    base = baseline_flags(summary, baseline_kernels)
    return {"false": len(found - set(slow)), "recall": len(found & set(slow)) / len(slow),
            "seconds": seconds, "baseline_false": len(base - set(slow)),
            "baseline_recall": len(base & set(slow)) / len(slow)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--planted", type=int, default=10)
    parser.add_argument("--baseline-kernels", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [one_job(args.ranks, args.kernels, args.planted, seed, args.baseline_kernels)
            for seed in range(args.jobs)]
    result = {
        "ranks": args.ranks, "kernels": args.kernels, "jobs": args.jobs,
        "planted_per_job": args.planted, "slowdown": 1.25,
        "false_ranks_per_job": float(np.mean([r["false"] for r in runs])),
        "false_ranks_by_job": [r["false"] for r in runs],
        "recall": float(np.mean([r["recall"] for r in runs])),
        "seconds_per_job": float(np.mean([r["seconds"] for r in runs])),
        "baseline": "mean W1 to peers + Q3+1.5 IQR fence per kernel",
        "baseline_kernels": args.baseline_kernels,
        "baseline_false_ranks_per_job": float(np.mean([r["baseline_false"] for r in runs])),
        "baseline_recall": float(np.mean([r["baseline_recall"] for r in runs])),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
