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
from score import baseline, workload

from argus_core.detect.l3 import score_kernels


def one_job(ranks: int, kernels: int, planted: int, seed: int, baseline_kernels: int) -> dict:
    """Score one seeded job; count false flags and recall, ours and the baseline's."""
    summary, slow = workload(ranks, kernels, planted, seed)
    t0 = time.perf_counter()
    scores = score_kernels(summary)
    seconds = time.perf_counter() - t0
    found = set(scores.rank[scores.flagged].tolist())
    _, base = baseline(summary, baseline_kernels)
    return {"false": len(found - slow), "recall": len(found & slow) / len(slow),
            "seconds": seconds, "baseline_false": len(base - slow),
            "baseline_recall": len(base & slow) / len(slow)}


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
