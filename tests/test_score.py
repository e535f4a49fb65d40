"""``argus score`` against a real Prometheus: summaries in, the core's L3 scores, stragglers and
verdicts out; sharding; and when Prometheus is down, frozen or a rank has no data, nothing
stale or guessed is published and the health metrics say so."""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest
from prom_support import Prometheus, serve_collectors
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from support import free_port

from argus_core.cli import main
from argus_core.score.core_adapter import judge
from argus_core.score.prometheus import PrometheusAPI, quote_label
from argus_core.score.service import ScoreConfig, Scorer, shard_of
from argus_core.score.snapshot import JobSnapshot, PhaseTable
from argus_core.simulate.summaries import synthetic_summaries
from argus_core.summaries import summary_families

RANKS = 16
SLOW_RANK = 5
SILENT_RANK = 99  # announced to a processor, never summarised
ANONYMOUS = ("llm-b", 15)  # summarised, never announced: scored with peer set 0, as the core


class Cluster:
    """What a cluster's processors and exporters expose: two jobs, one with a slow rank."""

    def __init__(self):
        self.started = time.time()
        self.summaries = {"llm-a": synthetic_summaries(RANKS, 4, slow={SLOW_RANK: 2.0}),
                          "llm-b": synthetic_summaries(RANKS, 4, seed=1)}

    def collect(self):
        yield from summary_families(self.summaries)
        labels = ["job", "rank", "host", "dp", "tp", "pp", "ep"]
        info = GaugeMetricFamily("argus_rank_info", "identity", labels=labels)
        phases = GaugeMetricFamily("argus_phase_window_seconds", "phase time",
                                   labels=[*labels, "phase", "stat"])
        totals = CounterMetricFamily("argus_phase_seconds", "phase time",
                                     labels=[*labels, "phase"])
        steps = CounterMetricFamily("argus_steps", "steps", labels=labels)
        elapsed = time.time() - self.started
        for job in self.summaries:
            for rank in [*range(RANKS), *([SILENT_RANK] if job == "llm-a" else [])]:
                # Two pipeline stages of 8: the scorer fetches and scores them one at a time.
                ident = [job, str(rank), f"node-{rank // 8}", str(rank % 8), "0",
                         str(rank // 8 if rank < RANKS else 0), "0"]
                if (job, rank) != ANONYMOUS:
                    info.add_metric(ident, 1)
                if rank == SILENT_RANK:
                    continue
                mlp = 0.06 if (job, rank) == ("llm-a", SLOW_RANK) else 0.03
                for phase, seconds in (("mlp", mlp), ("dp-allreduce", 0.01)):
                    phases.add_metric([*ident, phase, "median"], seconds)
                    totals.add_metric([*ident, phase], seconds * 10 * elapsed)
                steps.add_metric(ident, 10 * elapsed)
        yield from (info, phases, totals, steps)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server, target = serve_collectors(Cluster())
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), {"cluster": target}).start()
    prom.wait_for("argus_kernel_executions", count=2 * RANKS * 4 * 2)
    prom.wait_for('increase(argus_steps_total[5s]) > 0', count=2 * RANKS)
    yield prom
    prom.stop()
    server.shutdown()


def config(url: str, **kwargs) -> ScoreConfig:
    return ScoreConfig(prometheus=url, interval_s=1, window_s=60, rate_window="5s",
                       timeout_s=5, **kwargs)


def samples(scorer: Scorer) -> dict[str, list[tuple[dict, float]]]:
    """What the scorer's /metrics would serve, by metric name."""
    out: dict[str, list] = {}
    for family in scorer.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_a_round_scores_the_slow_rank_and_says_why(prometheus):
    scorer = Scorer(config(prometheus.url))
    assert scorer.run_round()
    out = samples(scorer)
    flagged = {(s["job"], s["rank"]) for s, v in out["argus_kernel_straggler"] if v == 1}
    assert flagged == {("llm-a", str(SLOW_RANK))}
    scored = {(s["job"], s["rank"]) for s, _ in out["argus_kernel_w1_score"]}
    assert scored == {(job, str(r)) for job in ("llm-a", "llm-b") for r in range(RANKS)}
    assert ("llm-a", str(SILENT_RANK)) not in scored  # no data, no score
    slow = [v for s, v in out["argus_kernel_w1_score"]
            if s["job"] == "llm-a" and s["rank"] == str(SLOW_RANK)]
    assert min(slow) > 0.5  # twice as slow: about +100% over the healthy reference
    assert {(s["job"], s["rank"], s["cause"]) for s, _ in out["argus_verdict"]} == {
        ("llm-a", str(SLOW_RANK), "compute")}
    unscored = {s["job"]: v for s, v in out["argus_scorer_unscored_ranks"]}
    assert unscored == {"llm-a": 1, "llm-b": 0}
    health = {name: values[0][1] for name, values in out.items() if name.startswith(
        "argus_scorer_") and len(values) == 1}
    assert time.time() - health["argus_scorer_last_success_timestamp_seconds"] < 60
    assert health["argus_scorer_series_fetched"] >= 2 * RANKS * 4 * 2 * 3
    assert health["argus_scorer_jobs"] == 2


def test_shards_split_the_jobs_between_scorers(prometheus):
    seen = []
    for shard in range(2):
        scorer = Scorer(config(prometheus.url, shard=shard, shards=2))
        assert scorer.run_round()
        jobs = set(scorer.published.judgements)
        assert jobs == {j for j in ("llm-a", "llm-b") if shard_of(j, 2) == shard}
        seen += jobs
    assert sorted(seen) == ["llm-a", "llm-b"]
    # Stable across processes and hosts (CRC-32, not Python's salted hash).
    assert [shard_of(f"job-{i}", 4) for i in range(8)] == [
        zlib.crc32(f"job-{i}".encode()) % 4 for i in range(8)]


def test_prometheus_down_publishes_nothing_and_says_so(prometheus):
    scorer = Scorer(config(prometheus.url))
    assert scorer.run_round()
    good = scorer.published.last_success
    scorer.api = PrometheusAPI(f"http://127.0.0.1:{free_port()}", timeout_s=1,
                               backoff_s=0.01)  # nothing listens there
    assert not scorer.run_round()
    out = samples(scorer)
    assert "argus_kernel_w1_score" not in out and "argus_verdict" not in out
    assert scorer.published.last_success == good
    assert scorer.published.query_failures >= 3  # every attempt counted
    rounds = {s["result"]: v for s, v in out["argus_scorer_rounds_total"]}
    assert rounds == {"ok": 1, "failed": 1}


def test_a_frozen_prometheus_times_out_then_recovers(prometheus):
    scorer = Scorer(ScoreConfig(prometheus=prometheus.url, window_s=60, rate_window="5s",
                                timeout_s=1))
    scorer.api.backoff_s = 0.01
    prometheus.pause()
    try:
        started = time.monotonic()
        assert not scorer.run_round()
        assert time.monotonic() - started < 15  # bounded by the timeout, with retries
        assert not scorer.published.judgements
    finally:
        prometheus.resume()
    assert scorer.run_round()
    assert set(scorer.published.judgements) == {"llm-a", "llm-b"}


def test_waiting_excuses_a_slow_collective_kernel():
    """A collective kernel slow only because its rank waits for a late peer is not a finding;
    the same kernel with no measured waiting is (link trouble)."""
    summary = synthetic_summaries(8, 1, slow={3: 2.0})
    summary.names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    coords = {r: (r, 0, 0, 0) for r in range(8)}
    mean_allreduce = np.full((8, 1), 0.010)
    mean_allreduce[3] = 0.030  # rank 3 waits 20 ms per step in the all-reduce

    def snapshot(times):
        table = PhaseTable(np.arange(8), ["dp-allreduce"], times,
                           np.array([coords[r] for r in range(8)]))
        return JobSnapshot("j", summary, coords, table, table, {r: 10.0 for r in range(8)})

    waiting = judge(snapshot(mean_allreduce))
    assert not waiting.kernels.straggler.any()
    assert waiting.wait_s[3] == pytest.approx(0.020)
    linked = judge(snapshot(np.full((8, 1), 0.010)))
    assert set(linked.kernels.rank[linked.kernels.straggler].tolist()) == {3}
    assert linked.verdicts == [(3, "communication")]


def test_query_strings_quote_job_names():
    assert quote_label('a"b\\c') == '"a\\"b\\\\c"'


@pytest.mark.parametrize(("argv", "message"), [
    (["--shard", "2/2"], "0 <= I < N"),
    (["--shard", "x"], "expected I/N"),
    (["--listen", "9800"], "expected HOST:PORT"),
    (["--prometheus", "localhost:9090"], "expected http(s)://host:port"),
])
def test_cli_refuses_bad_arguments(argv, message, capsys):
    base = {"--prometheus": "http://127.0.0.1:9090"}
    args = ["score"]
    for key, value in base.items():
        if key not in argv:
            args += [key, value]
    assert main([*args, *argv]) == 2
    assert message in capsys.readouterr().err


def test_summaries_join_in_any_order(prometheus):
    """Prometheus returns series sorted by labels and the scorer aligns the three queries by
    position; shuffled answers (another store, a proxy) take the join by labels instead and
    give the same table."""
    from argus_core.score.snapshot import kernel_summary

    executions = prometheus.query('argus_kernel_executions{job="llm-a"}')
    durations = prometheus.query('argus_kernel_duration_seconds{job="llm-a"}')
    sorted_table = kernel_summary(executions, durations, 60_000_000_000)
    key = ("rank", "kernel", "stream", "cluster")
    order = [tuple(r["metric"][k] for k in key) for r in executions]
    p50 = [tuple(r["metric"][k] for k in key) for r in durations
           if r["metric"]["quantile"] == "0.5"]
    assert p50 == order  # the real Prometheus takes the positional path
    rng = np.random.default_rng(0)
    shuffled = kernel_summary([executions[i] for i in rng.permutation(len(executions))],
                              [durations[i] for i in rng.permutation(len(durations))],
                              60_000_000_000)
    assert len(sorted_table) == len(shuffled) == RANKS * 4 * 2

    def rows(table):
        return sorted(zip(table.rank.tolist(), [table.names[k] for k in table.kernel],
                          table.stream.tolist(), table.cluster.tolist(), table.count.tolist(),
                          table.p50_ns.tolist(), table.p99_ns.tolist(), strict=True))

    assert rows(sorted_table) == rows(shuffled)
    missing = kernel_summary(executions[1:], durations, 60_000_000_000)
    assert len(missing) == len(sorted_table) - 1  # no count, no row: nothing guessed
