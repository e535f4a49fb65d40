"""Benchmark: a scorer round over several jobs with the next job fetched while one is judged
(``--fetch-ahead 1``, the default) against one job at a time (``--fetch-ahead 0``, the
baseline), measured in the same run on the same real victoria-metrics, with each ``--read``.

    python bench/scorer_overlap.py [--jobs 8] [--ranks 1000] [--kernels 100] [--rounds 3]
                                   [--json]

Every job is the processors' kernel-summary exposition of ``bench/scorer_fetch.py`` (2
clusters a kernel, executions, p50 and p99; one rank twice as slow) and every rank's
``argus_rank_info``, imported at two timestamps as two scrapes would leave them. Rounds
(``Scorer.run_round``: list, fetch, decode, judge) alternate between the two settings, ABBA;
the medians of each. The store holds no exporter series (L3 only, as scorer_fetch.py). Last
line (--json): ``{"jobs", "ranks", "kernels", "series", "<read>_ahead_round_seconds",
"<read>_one_at_a_time_round_seconds", "<read>_ratio_to_one_at_a_time", "agree" (both settings
publish the same verdicts and kernel stragglers for every job), "found" (every job's slow rank
is its only verdict), ...}``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _report import report
from rules_scale import kernel_exposition, slow_rank
from scorer_fetch import LOOKBACK_S, load, rank_info, start_store, wait_searchable

from argus_core.score.prometheus import PrometheusAPI
from argus_core.score.service import READS, ScoreConfig, Scorer


def one_round(url: str, read: str, ahead: int) -> tuple[float | None, dict]:
    """One whole round: its seconds (None when it failed) and, per job, its verdicts and
    kernel stragglers."""
    scorer = Scorer(ScoreConfig(prometheus=url, read=read, lookback_s=LOOKBACK_S,
                                fetch_ahead=ahead, timeout_s=600,
                                max_answer_bytes=4 << 30))
    ok = scorer.run_round()
    found = {}
    for job, judgement in scorer.published.judgements.items():
        kernels = judgement.kernels
        flagged = sorted(zip(kernels.rank[kernels.straggler].tolist(),
                             [kernels.names[k] for k in kernels.kernel[kernels.straggler]],
                             strict=True))
        found[job] = (sorted(judgement.verdicts), flagged)
    return (scorer.published.round_seconds if ok else None), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=1_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each setting")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    jobs = [f"bench-{i}" for i in range(args.jobs)]
    workdir = Path(tempfile.mkdtemp(prefix="argus-scorer-overlap-"))
    process, url = start_store(workdir)
    try:
        summaries = kernel_exposition(args.ranks, args.kernels, 10)
        t0, now = time.perf_counter(), int(time.time())
        for job in jobs:
            load(url, [*summaries, rank_info(args.ranks, job)], now, job)
        load_s = time.perf_counter() - t0
        api = PrometheusAPI(url, timeout_s=600, max_answer_bytes=4 << 30)
        for job in jobs:
            wait_searchable(api, job, args.ranks)
        result = {"jobs": args.jobs, "ranks": args.ranks, "kernels": args.kernels,
                  "series": args.jobs * args.ranks * (args.kernels * 2 * 3 + 1),
                  "import_seconds": round(load_s, 1)}
        agree, found = True, True
        expected = [(slow_rank(args.ranks), "compute")]
        for read in READS:
            seconds: dict[int, list[float]] = {1: [], 0: []}
            for r in range(args.rounds):
                outcomes = {}
                for ahead in ((1, 0) if r % 2 == 0 else (0, 1)):
                    took, outcomes[ahead] = one_round(url, read, ahead)
                    if took is None:
                        raise SystemExit(f"a round with --read {read} --fetch-ahead {ahead} "
                                         f"failed")
                    seconds[ahead].append(took)
                    print(f"{read} fetch-ahead {ahead}: {took:.2f} s", file=sys.stderr,
                          flush=True)
                agree &= outcomes[0] == outcomes[1]
                found &= (set(outcomes[1]) == set(jobs)
                          and all(v == expected for v, _ in outcomes[1].values()))
            ahead_s, alone_s = statistics.median(seconds[1]), statistics.median(seconds[0])
            result[f"{read}_ahead_round_seconds"] = round(ahead_s, 2)
            result[f"{read}_one_at_a_time_round_seconds"] = round(alone_s, 2)
            result[f"{read}_ratio_to_one_at_a_time"] = round(ahead_s / alone_s, 3)
            result[f"{read}_round_seconds_all"] = {
                "ahead": [round(s, 2) for s in seconds[1]],
                "one_at_a_time": [round(s, 2) for s in seconds[0]]}
        result.update(agree=agree, found=found)
    finally:
        process.stop(60)
        shutil.rmtree(workdir, ignore_errors=True)
    report(result, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
