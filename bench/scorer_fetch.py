"""Benchmark: the scorer's fetch of one job's kernel summaries from a real victoria-metrics,
each peer set selected by its ranks (the scorer's way) against the baseline of a join with
``argus_rank_info`` (measured in the same run, on the same store).

    python bench/scorer_fetch.py [--ranks 2000] [--kernels 100] [--with-exporters]
                                 [--rounds-only] [--rounds 3] [--json]

victoria-metrics is started as ``argus stack up --engine victoriametrics`` starts it; the
processors' kernel-summary exposition (``rules_scale.kernel_exposition``: 2 clusters per
kernel, executions, p50 and p99) and every rank's ``argus_rank_info`` (tp=4, ep=2, pp=5) are
imported at two timestamps 15 s apart, as two scrapes would leave them. Then, for one peer set
(pp=0, a fifth of the ranks): the baseline query, the scorer's query, and each's series;
and the scorer's whole fetch (``fetch_summaries``: every peer set, decoded into the table the
core scores) and one shard's of five (``--split peer-set``); each also read through
victoria-metrics' export (``--read export``: ``/api/v1/export/csv``, decoded as it streams),
against the query in the same run, and checked to give the same summaries. Last, whole
scorer rounds (list, fetch, decode, judge) with each ``--read``, by one scorer and by one
shard of five, each scorer ``--rounds`` rounds in a row (as it runs one a window; the
median reported, and each round). ``--with-exporters``: every rank's exporter series
(``rules_scale.SyntheticCluster``: what ``StepMetrics`` serves, the slow rank's mlp phase 2x)
are imported too, so that the rounds read and judge L2 beside L3, as the stack's scorer does;
``--rounds-only``: the whole rounds alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from _report import report
from rules_scale import SyntheticCluster, kernel_exposition, slow_rank, topology_for

from argus_core.schema import AXES
from argus_core.score.prometheus import PrometheusAPI
from argus_core.score.service import READS, SPLIT_PEER_SETS, ScoreConfig, Scorer
from argus_core.score.snapshot import (
    SUMMARY_INTS,
    SUMMARY_TEXTS,
    fetch_summaries,
    rank_coords,
    ranks_regex,
)
from argus_core.stack import engines
from argus_core.stack.processes import Process, free_port, start, wait_ready
from argus_core.stack.stack import binary
from argus_core.summaries import KernelSummary

JOB = "bench"
LOOKBACK_S = 3600.0  # the export's range: both imported samples of every series


def rank_info(ranks: int, job: str = JOB) -> bytes:
    """Every rank's ``argus_rank_info`` as the processors expose it."""
    coords = topology_for(ranks).coords()
    lines = [f'argus_rank_info{{job="{job}",rank="{r}",host="node-{r // 8}",'
             + ",".join(f'{a}="{coords[r, i]}"' for i, a in enumerate(AXES)) + "} 1"
             for r in range(ranks)]
    return ("\n".join(lines) + "\n").encode()


def load(url: str, parts: list[bytes], now: int, job: str = JOB) -> float:
    """Import the exposition at two timestamps, as ``job``'s; seconds it took."""
    t0 = time.perf_counter()
    for stamp in (now - 30, now - 15):
        for part in parts:
            request = urllib.request.Request(
                f"{url}/api/v1/import/prometheus?timestamp={stamp * 1000}&extra_label=job={job}",
                data=part)
            with urllib.request.urlopen(request, timeout=600) as answer:
                answer.read()
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=60) as answer:
        answer.read()
    return time.perf_counter() - t0


def same_rows(a: KernelSummary, b: KernelSummary) -> bool:
    """Whether two summaries hold the same rows (kernels by name; in any order)."""
    def rows(s: KernelSummary) -> np.ndarray:
        names = np.array(s.names, dtype=object)[s.kernel] if len(s.kernel) else []
        table = np.rec.fromarrays([s.rank, np.asarray(names, dtype=str), s.stream, s.cluster,
                                   s.count, s.p50_ns, s.p99_ns])
        return np.sort(table)
    return len(a.rank) == len(b.rank) and bool((rows(a) == rows(b)).all())


def scorer_rounds(url: str, ranks: int, rounds: int = 1) -> dict:
    """Whole scorer rounds (``Scorer.run_round``: list, fetch, decode, judge) of the job by
    one scorer and by shard 0 of five (``--split peer-set``), with each ``--read``: L3, and
    L2 where the store holds the exporters' series too. Each scorer runs ``rounds`` rounds
    in a row, as it does one a window: ``*_round_seconds`` is the median of them,
    ``*_rounds_seconds`` each (the first reads a store whose caches the previous scorer's
    reads left; a failed round is None)."""
    out = {}
    for read in READS:
        for shards in (1, 5):
            scorer = Scorer(ScoreConfig(prometheus=url, read=read, lookback_s=LOOKBACK_S,
                                        split=SPLIT_PEER_SETS, shards=shards, timeout_s=600,
                                        max_answer_bytes=4 << 30))
            seconds = []
            for _ in range(rounds):
                ok = scorer.run_round()
                seconds.append(scorer.published.round_seconds if ok else None)
            judgement = scorer.published.judgements.get(JOB)
            verdicts = [] if judgement is None else judgement.verdicts
            name = f"{read}_{'one_scorer' if shards == 1 else 'shard_of_5'}"
            out[f"{name}_round_seconds"] = (None if None in seconds
                                            else float(np.median(seconds)))
            out[f"{name}_rounds_seconds"] = seconds
            out[f"{name}_verdicts"] = [f"{rank}:{cause}" for rank, cause in verdicts]
    out["slow_rank"] = slow_rank(ranks)
    out["round_export_ratio_to_query"] = (out["export_one_scorer_round_seconds"]
                                          / out["query_one_scorer_round_seconds"])
    return out


def start_store(workdir: Path) -> tuple[Process, str]:
    """victoria-metrics as ``argus stack up --engine victoriametrics`` starts it, ready; its
    URL."""
    address = f"127.0.0.1:{free_port()}"
    process = start("victoria-metrics", [
        binary("victoria-metrics"), f"-httpListenAddr={address}",
        f"-storageDataPath={workdir / 'data'}", "-retentionPeriod=1d",
        "-search.latencyOffset=1s", f"-search.maxUniqueTimeseries={engines.MAX_QUERY_SERIES}",
        # the imported samples stay the latest for the whole run (minutes at 6 M series),
        # as a live store's are refreshed every scrape
        "-search.maxStalenessInterval=1h"],
        workdir / "logs")
    try:
        wait_ready(process, f"http://{address}/health", timeout=120)
    except BaseException:
        process.stop(60)
        raise
    return process, f"http://{address}"


def wait_searchable(api: PrometheusAPI, job: str, ranks: int) -> None:
    """Until every rank's imported ``argus_rank_info`` is searchable (the store's caches
    see imported samples a moment later)."""
    deadline = time.monotonic() + 120
    while len(api.query(f'argus_rank_info{{job="{job}"}}')) < ranks:
        if time.monotonic() > deadline:
            raise SystemExit(f"{job}'s imported argus_rank_info never became searchable")
        time.sleep(1)


def store_series(url: str) -> int:
    """How many series the store holds (victoria-metrics' own count: a ``count()`` over
    millions of series runs past its query timeout)."""
    with urllib.request.urlopen(f"{url}/api/v1/series/count", timeout=120) as answer:
        return int(json.load(answer)["data"][0])


def timed(call) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def fetch_comparisons(api: PrometheusAPI, url: str, args) -> dict:
    """One peer set by a join, by its ranks and exported; the whole job's and one shard's
    fetch queried and exported (the same rows checked); then the whole rounds."""
    coords = rank_coords(api.query(f'argus_rank_info{{job="{JOB}"}}'))
    match = f'job="{JOB}"'
    ranks = sorted(r for r, c in coords.items() if c[AXES.index("pp")] == 0)
    join = f'\nand on (job, rank) argus_rank_info{{{match},pp="0"}}'
    by_ranks = f'{match},rank=~"{ranks_regex(ranks)}"'

    def peer_set(selector: str, where: str) -> int:
        executions = api.query_columns(f"argus_kernel_executions{{{selector}}}{where}",
                                       SUMMARY_INTS, ("kernel",))
        durations = api.query_columns(f"argus_kernel_duration_seconds{{{selector}}}{where}",
                                      SUMMARY_INTS, SUMMARY_TEXTS)
        return len(executions) + len(durations)

    def exported(selector: str) -> int:
        executions = api.export_columns(f"argus_kernel_executions{{{selector}}}",
                                        LOOKBACK_S, SUMMARY_INTS, ("kernel",))
        durations = api.export_columns(f"argus_kernel_duration_seconds{{{selector}}}",
                                       LOOKBACK_S, SUMMARY_INTS, SUMMARY_TEXTS)
        return len(executions) + len(durations)

    joined_n, joined_s = timed(lambda: peer_set(match, join))
    ranked_n, ranked_s = timed(lambda: peer_set(by_ranks, ""))
    export_n, export_s = timed(lambda: exported(by_ranks))
    window_ns = 60 * 10**9
    fetches = {}
    for read, lookback in (("query", None), ("export", LOOKBACK_S)):
        fetches[read] = [timed(lambda lookback=lookback, owns=owns: fetch_summaries(
            api, match, coords, "pp", window_ns, owns, export_lookback_s=lookback))
            for owns in (None, lambda p: p % 5 == 0)]
    (whole, _, _), whole_s = fetches["query"][0]
    (shard, _, _), shard_s = fetches["query"][1]
    (whole_e, _, _), whole_export_s = fetches["export"][0]
    (shard_e, _, _), shard_export_s = fetches["export"][1]
    return {
        "peer_set_series": ranked_n,
        "baseline_peer_set_fetch_seconds": joined_s,
        "peer_set_fetch_seconds": ranked_s,
        "peer_set_fetch_ratio_to_baseline": ranked_s / joined_s,
        "peer_sets_agree": joined_n == ranked_n,
        "job_fetch_seconds": whole_s, "job_summary_rows": len(whole.rank),
        # every cluster of every rank fetched (2 clusters a kernel), a fifth by the shard
        "complete": (len(whole.rank) == args.ranks * args.kernels * 2
                     and len(shard.rank) == args.ranks // 5 * args.kernels * 2),
        "job_series_per_second": 3 * len(whole.rank) / whole_s,
        "shard_of_5_fetch_seconds": shard_s, "shard_summary_rows": len(shard.rank),
        "peer_set_export_seconds": export_s,
        "peer_set_export_ratio_to_query": export_s / ranked_s,
        "peer_set_export_agrees": export_n == ranked_n,
        "job_export_seconds": whole_export_s,
        "job_export_ratio_to_query": whole_export_s / whole_s,
        "shard_of_5_export_seconds": shard_export_s,
        "shard_of_5_export_ratio_to_query": shard_export_s / shard_s,
        "exported_summaries_agree": same_rows(whole, whole_e) and same_rows(shard, shard_e),
        **scorer_rounds(url, args.ranks, args.rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--with-exporters", action="store_true",
                        help="import every rank's exporter series too (the rounds judge L2)")
    parser.add_argument("--rounds-only", action="store_true",
                        help="measure the whole scorer rounds alone")
    parser.add_argument("--rounds", type=int, default=3,
                        help="whole rounds each scorer runs in a row (their median reported)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="argus-scorer-fetch-"))
    process, url = start_store(workdir)
    try:
        parts = [*kernel_exposition(args.ranks, args.kernels, 10), rank_info(args.ranks)]
        if args.with_exporters:
            cluster = SyntheticCluster(args.ranks, 10, [])
            parts += [cluster.render(target) for target in range(10)]
        load_s = load(url, parts, int(time.time()))
        api = PrometheusAPI(url, timeout_s=600, max_answer_bytes=4 << 30)
        wait_searchable(api, JOB, args.ranks)
        base = {"ranks": args.ranks, "kernels": args.kernels, "import_seconds": load_s,
                "with_exporters": args.with_exporters,
                "store_series": store_series(url)}
        result = {**base, **(scorer_rounds(url, args.ranks, args.rounds) if args.rounds_only
                             else fetch_comparisons(api, url, args))}
    finally:
        process.stop(60)
        shutil.rmtree(workdir, ignore_errors=True)
    report(result, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
