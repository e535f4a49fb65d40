"""Benchmark: the series Argus adds per rank and per job, and what the processor's per-rank
kernel cap (``--top-k``) trades: series against the share of kernel time L3 sees.

    python bench/cardinality.py [--ranks 10000] [--kernels 100] [--seeds 10] [--json]

Exporter series are counted from ``StepMetrics`` itself for one rank (the simulator's eight
phases); processor series from its own rendering (``top_kernels``, ``summary_lines``,
``tail_lines``) of synthetic 60 s summaries of ``--kernels`` kernels x 2 clusters per rank,
whose kernel durations spread over three orders of magnitude (3 us to 9 ms, log-uniform) and
whose counts differ per kernel; scorer series are what it publishes per scored kernel (score
and straggler flag) and per rank (its wait). For each cap k: series per rank and per job of
``--ranks``, and the share of each rank's kernel time in its top k (the median over ranks and
``--seeds`` kernel mixes, and the worst seed's median). The baseline is no cap (k = every
kernel): its ratio to each cap is the saving.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from rules_scale import exporter_templates

from argus_core.simulate.summaries import synthetic_summaries
from argus_core.summaries import kernel_tail, summary_lines, tail_lines, top_kernels

CAPS = (8, 16, 32, 64)


def processor_series(summary, k: int) -> tuple[int, np.ndarray]:
    """Series the processor serves for the summaries' ranks under cap ``k`` (counted from the
    rendered lines), and each rank's share of kernel time kept."""
    top = top_kernels(summary, k)
    quantiles, counts = summary_lines(top, "bench")
    seconds, kernels = tail_lines("bench", kernel_tail(summary, top))
    lines = sum(text.count("\n") for text in (quantiles, counts, seconds, kernels))
    ranks = int(summary.rank.max()) + 1
    total = np.bincount(summary.rank, summary.sum_ns, ranks)
    kept = np.bincount(top.rank, top.sum_ns, ranks)
    return lines + ranks, kept / total  # + argus_rank_info, one per rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000, help="ranks of the job totals")
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sample-ranks", type=int, default=64,
                        help="ranks rendered per seed (series per rank are the same)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    exporter = len(exporter_templates())
    caps = [*(k for k in CAPS if k < args.kernels), args.kernels]
    rows = []
    for k in caps:
        per_rank, medians = [], []
        for seed in range(args.seeds):
            summary = synthetic_summaries(args.sample_ranks, args.kernels, seed=seed,
                                          count_jitter=0.3)
            series, share = processor_series(summary, k)
            per_rank.append(series / args.sample_ranks)
            medians.append(float(np.median(share)))
        processor = float(np.mean(per_rank))
        scorer = 2 * k + 1
        rows.append({"top_k": k, "exporter_per_rank": exporter,
                     "processor_per_rank": processor, "scorer_per_rank": scorer,
                     "per_rank": exporter + processor + scorer,
                     "per_job": round((exporter + processor + scorer) * args.ranks),
                     "kernel_time_covered_median": float(np.median(medians)),
                     "kernel_time_covered_worst_seed": float(np.min(medians))})
    baseline = rows[-1]["per_job"]
    for row in rows:
        row["series_vs_uncapped"] = row["per_job"] / baseline
    result = {"ranks": args.ranks, "kernels": args.kernels, "seeds": args.seeds, "caps": rows}
    if not args.json:
        print(f"{'top-k':>6} {'per rank':>9} {'per job':>12} {'vs all':>7} {'time seen':>10}")
        for row in rows:
            print(f"{row['top_k']:>6} {row['per_rank']:>9.0f} {row['per_job']:>12,} "
                  f"{row['series_vs_uncapped']:>7.2f} "
                  f"{row['kernel_time_covered_median']:>9.1%}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
