"""``argus score`` against a real Prometheus: summaries in, the core's L3 scores, stragglers and
verdicts out; sharding; and when Prometheus is down, frozen or a rank has no data, nothing
stale or guessed is published and the health metrics say so."""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest
from prom_support import PhaseCluster, Prometheus, serve_collectors
from support import free_port

from argus_core.cli import main
from argus_core.score.core_adapter import judge
from argus_core.score.prometheus import PrometheusAPI, quote_label
from argus_core.score.service import ScoreConfig, Scorer, shard_of
from argus_core.score.snapshot import JobSnapshot, PhaseTable
from argus_core.simulate.summaries import synthetic_summaries

RANKS = 16
SLOW_RANK = 5
SILENT_RANK = 99  # announced to a processor, never summarised
ANONYMOUS = ("llm-b", 15)  # summarised, never announced: scored with peer set 0, as the core


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server, target = serve_collectors(PhaseCluster(
        RANKS, {"llm-a": SLOW_RANK, "llm-b": None}, silent={"llm-a": SILENT_RANK},
        anonymous=ANONYMOUS))
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
    # The one slow rank's own GPU is the suspect (no placement: named by host and rank).
    assert {(s["job"], s["unit_kind"], s["unit"], s["cause"], v)
            for s, v in out["argus_suspect"]} == {
        ("llm-a", "gpu", f"node-0/gpu{SLOW_RANK}", "compute", 1.0)}
    ((info, _),) = out["argus_suspect_info"]
    assert (info["ranks"], info["hosts"], info["shared"]) == (str(SLOW_RANK), "node-0", "false")
    # L2 too (the core's, every finding): its mlp against its dp group of 8 ...
    assert {(s["job"], s["rank"], s["phase"], s["axis"], s["kind"])
            for s, _ in out["argus_phase_straggler_ratio"]} == {
        ("llm-a", str(SLOW_RANK), "mlp", "dp", "compute")}
    # ... with the group statistics it was judged against, per job.
    medians = {(s["job"], s["axis"], s["pp"]): v
               for s, v in out["argus_l2_group_median_seconds"] if s["phase"] == "mlp"}
    assert medians == {(job, "dp", pp): pytest.approx(0.03) for job in ("llm-a", "llm-b")
                       for pp in ("0", "1")}
    assert {s["job"] for s, _ in out["argus_l2_z_family"]} == {"llm-a", "llm-b"}
    unscored = {s["job"]: v for s, v in out["argus_scorer_unscored_ranks"]}
    assert unscored == {"llm-a": 1, "llm-b": 0}
    health = {name: values[0][1] for name, values in out.items() if name.startswith(
        "argus_scorer_") and len(values) == 1}
    assert time.time() - health["argus_scorer_last_success_timestamp_seconds"] < 60
    assert health["argus_scorer_series_fetched"] >= 2 * RANKS * 4 * 2 * 3
    assert health["argus_scorer_jobs"] == 2
    assert health["argus_scorer_decode_fallbacks_total"] == 0  # Prometheus's own layout


def test_beyond_promql_publishes_only_what_promql_rules_cannot_judge(prometheus):
    """``--l2-findings beyond-promql`` (rules with ``l2_source: promql``): the dp group of 8
    is the rules' comparison, so its finding is not published twice."""
    scorer = Scorer(config(prometheus.url, l2_findings="beyond-promql"))
    assert scorer.run_round()
    assert "argus_phase_straggler_ratio" not in samples(scorer)
    with pytest.raises(ValueError, match="--l2-findings 'some'"):
        config(prometheus.url, l2_findings="some")
    # Rules that compare only tp (their `axes`) leave the dp group's finding to the scorer.
    scorer = Scorer(config(prometheus.url, l2_findings="beyond-promql", promql_axes=("tp",)))
    assert scorer.run_round()
    assert {s["axis"] for s, _ in samples(scorer)["argus_phase_straggler_ratio"]} == {"dp"}


def test_ranks_timed_on_the_host_clock_are_compared_with_its_wider_floor(tmp_path):
    """Three jobs alike but for their exporters' clock, each with rank 5 1.3x its dp group's
    mlp: exporters timing on a device (and ones that do not say) page on it; exporters timing
    on the host clock, where healthy ranks sharing cores differ that much, do not."""
    jobs = {"gpu-job": "device", "cpu-job": "host", "unsaid": None}
    server, target = serve_collectors(PhaseCluster(
        RANKS, dict.fromkeys(jobs, SLOW_RANK), mlp_ratio=1.3,
        clocks={job: clock for job, clock in jobs.items() if clock}))
    (tmp_path / "prometheus").mkdir()
    prom = Prometheus(tmp_path / "prometheus", {"cluster": target}).start()
    try:
        prom.wait_for("argus_phase_clock_info", count=2 * RANKS)
        prom.wait_for('increase(argus_steps_total[5s]) > 0', count=len(jobs) * RANKS)
        scorer = Scorer(config(prom.url))
        assert scorer.run_round()
        out = samples(scorer)
    finally:
        prom.stop()
        server.shutdown()
    assert {(s["job"], s["rank"], s["phase"]) for s, _ in out["argus_phase_straggler_ratio"]} == {
        (job, str(SLOW_RANK), "mlp") for job in ("gpu-job", "unsaid")}


def test_the_scorer_takes_what_it_shares_with_the_rules_from_their_config(tmp_path):
    """``argus score --config``: the rules' l2_source and axes decide what it publishes, and
    their rate window and selector how it reads; flags override the file."""
    from argus_core.cli.score import shared_settings

    path = tmp_path / "argus.yml"
    path.write_text("l2_source: promql\naxes: [dp]\nrate_window: 5m\n"
                    "selectors: {exporters: 'cluster=\"eu\"', processor: 'cluster=\"eu\"'}\n")
    assert shared_settings(str(path)) == {
        "l2_findings": "beyond-promql", "promql_axes": ("dp",), "rate_window": "5m",
        "selector": 'cluster="eu"'}
    assert shared_settings(None) == {}
    path.write_text("selectors: {exporters: 'cluster=\"eu\"'}\n")
    with pytest.raises(ValueError, match="one selector"):
        shared_settings(str(path))
    assert shared_settings(str(path), selector_given=True)["l2_findings"] == "all"


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


RESULT_FAMILIES = ("argus_kernel_w1_score", "argus_kernel_straggler", "argus_verdict",
                   "argus_rank_wait_seconds", "argus_phase_straggler_ratio",
                   "argus_l2_group_median_seconds", "argus_l2_group_threshold_seconds",
                   "argus_l2_log_ratio_scale", "argus_l2_z_family", "argus_scorer_l2_tests")


def published(scorers: list[Scorer]) -> dict[str, list[tuple[tuple, float]]]:
    """Every result series the scorers publish together, sorted, by family."""
    out: dict[str, list] = {name: [] for name in RESULT_FAMILIES}
    for scorer in scorers:
        for name, rows in samples(scorer).items():
            if name in out:
                out[name] += [(tuple(sorted(labels.items())), value) for labels, value in rows]
    return {name: sorted(rows) for name, rows in out.items()}


@pytest.mark.parametrize("shards", [2, 3])
def test_peer_set_shards_publish_together_exactly_what_one_scorer_does(prometheus, shards):
    """``--split peer-set``: every shard scores some peer sets of every job (here 2 per job,
    pp = 0 and 1); the union of what they publish is the single scorer's, series for series
    (no series twice, none missing, the same values), and each says which peer sets it
    scored."""
    def round_of(scorers: list[Scorer]) -> dict:
        for scorer in scorers:
            assert scorer.run_round()
        return published(scorers)

    single = [Scorer(config(prometheus.url))]
    split = [Scorer(config(prometheus.url, shard=i, shards=shards, split="peer-set"))
             for i in range(shards)]
    # The exporters' counters advance between rounds: compare rounds run back to back, and
    # take a pair in which the steps' rates did not move.
    for _ in range(5):
        one, together = round_of(single), round_of(split)
        if together == one:
            break
    assert together == one
    assert one["argus_verdict"] and one["argus_kernel_w1_score"]
    owned = [(s["job"], s["position"]) for scorer in split
             for s, _ in samples(scorer).get("argus_scorer_peer_set_info", [])]
    assert sorted(owned) == [(job, pp) for job in ("llm-a", "llm-b") for pp in ("0", "1")]
    unscored = {}
    for scorer in split:
        for labels, value in samples(scorer)["argus_scorer_unscored_ranks"]:
            unscored[labels["job"]] = unscored.get(labels["job"], 0) + value
    assert unscored == {"llm-a": 1, "llm-b": 0}
    with pytest.raises(ValueError, match="--split 'rank'"):
        config(prometheus.url, split="rank")


def test_fetching_ahead_publishes_exactly_what_one_job_at_a_time_does(prometheus):
    """``--fetch-ahead 1`` (the default: the next job fetched while one is judged) and 0 (one
    job at a time) publish the same series from back-to-back rounds."""
    def round_of(scorer: Scorer) -> dict:
        assert scorer.run_round()
        return published([scorer])

    ahead, one_by_one = Scorer(config(prometheus.url)), Scorer(config(prometheus.url,
                                                                      fetch_ahead=0))
    for _ in range(5):  # a pair of rounds in which the steps' rates did not move
        if round_of(ahead) == round_of(one_by_one):
            break
    assert published([ahead]) == published([one_by_one])
    assert published([ahead])["argus_verdict"]
    assert ahead.config.fetch_ahead == 1 and set(ahead.published.judgements) == {
        "llm-a", "llm-b"}


@pytest.mark.parametrize("seed", range(20))
def test_a_rank_regex_matches_exactly_its_ranks(seed):
    """The peer-set selector's regex matches every rank of the set and no other rank text,
    whatever the set: strided, blocks, random, across digit counts."""
    import random
    import re

    from argus_core.score.snapshot import ranks_regex

    rng = random.Random(seed)
    world = rng.choice([7, 100, 1_000, 12_000])
    kind = seed % 3
    if kind == 0:  # the ranks at one position of an axis
        stride = rng.randint(1, 9)
        ranks = set(range(rng.randrange(stride), world, stride))
    elif kind == 1:  # blocks of consecutive ranks
        block = rng.randint(1, 64)
        ranks = {r for r in range(world) if (r // block) % 3 == seed % 2}
    else:
        ranks = set(rng.sample(range(world), rng.randint(1, world)))
    ranks = ranks or {world - 1}
    pattern = re.compile(ranks_regex(sorted(ranks)))  # anchored, as PromQL anchors it
    texts = [str(r) for r in range(world + 100)] + ["", "-1", "01", "1 ", "x"]
    assert {t for t in texts if pattern.fullmatch(t)} == set(map(str, ranks))


def test_ranks_too_many_for_a_short_regex_are_selected_by_a_join_to_the_same_result(
        prometheus, monkeypatch):
    """A peer set whose rank regex would be too long for the engine's bound on a query is
    fetched by a join with argus_rank_info instead, and scores exactly the same."""
    from argus_core.score import snapshot

    def round_of(scorer: Scorer) -> dict:
        assert scorer.run_round()
        return published([scorer])

    by_regex = Scorer(config(prometheus.url))
    by_join = Scorer(config(prometheus.url))
    queries: list[str] = []
    query_columns = by_join.api.query_columns

    def recorded(expr: str, *args, **kwargs):
        queries.append(expr)
        return query_columns(expr, *args, **kwargs)

    by_join.api.query_columns = recorded
    for _ in range(5):  # rounds back to back, until the steps' rates did not move between
        one = round_of(by_regex)
        with monkeypatch.context() as patch:
            patch.setattr(snapshot, "MAX_RANKS_REGEX", 0)
            other = round_of(by_join)
        if one == other:
            break
    assert one == other and one["argus_kernel_w1_score"]
    summaries = [q for q in queries if q.startswith("argus_kernel_")]
    assert summaries and all("argus_rank_info" in q and "rank=~" not in q for q in summaries)


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


def test_waiting_for_a_late_arriver_excuses_a_slow_collective_kernel():
    """A collective kernel slow only because its rank reached the collective early and waited
    there for the last arriver is not a finding; the same kernel with every rank arriving
    together is (the link), and L2 names it: waiting is measured from arrival skew."""
    summary = synthetic_summaries(8, 1, slow={3: 2.0})
    summary.names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    coords = {r: (r, 0, 0, 0) for r in range(8)}

    def snapshot(mlp, allreduce, wall):
        table = PhaseTable(np.arange(8), ["mlp", "dp-allreduce"],
                           np.column_stack([mlp, allreduce]),
                           np.array([coords[r] for r in range(8)]), wall, ["node-0"] * 8)
        return JobSnapshot("j", summary, coords, table, {r: 10.0 for r in range(8)})

    allreduce = np.full(8, 0.010)
    allreduce[3] = 0.030  # rank 3's all-reduce takes 20 ms longer ...
    early = np.full(8, 0.030)
    early[3] = 0.010  # ... because it reaches it 20 ms before the others
    waiting = judge(snapshot(early, allreduce, np.full(8, 0.042)))
    assert waiting.wait_s[3] == pytest.approx(0.020)
    assert not waiting.kernels.straggler.any()
    assert not waiting.phases and not waiting.verdicts
    together = np.full(8, 0.030)  # everyone arrives at once: the time is the link's
    linked = judge(snapshot(together, allreduce, together + allreduce))
    assert linked.wait_s[3] == pytest.approx(0.0)
    assert set(linked.kernels.rank[linked.kernels.straggler].tolist()) == {3}
    assert [(f.rank, f.phase, f.axis, f.kind) for f in linked.phases] == [
        (3, "dp-allreduce", "dp", "communication")]
    assert linked.phases[0].ratio == pytest.approx(3.0)
    assert linked.verdicts == [(3, "communication")]


def test_query_strings_quote_job_names():
    assert quote_label('a"b\\c') == '"a\\"b\\\\c"'


@pytest.mark.parametrize(("argv", "message"), [
    (["--shard", "2/2"], "0 <= I < N"),
    (["--shard", "x"], "expected I/N"),
    (["--listen", "9800"], "expected HOST:PORT"),
    (["--prometheus", "localhost:9090"], "expected http(s)://host:port"),
    (["--fetch-ahead", "-1"], "--fetch-ahead -1: expected 0 to 4 jobs"),
    (["--fetch-ahead", "9"], "--fetch-ahead 9: expected 0 to 4 jobs"),
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
    from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS
    from argus_core.score.snapshot import kernel_summary as from_columns
    from argus_core.score.vector_columns import columns_from_result

    def kernel_summary(executions, durations, window_ns):
        return from_columns(columns_from_result(executions, SUMMARY_INTS, ("kernel",)),
                            columns_from_result(durations, SUMMARY_INTS, SUMMARY_TEXTS),
                            window_ns)

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


def test_real_prometheus_answers_are_read_as_columns(prometheus):
    """Prometheus's own answers (Debian's 2.42) have the layout the columnar reader expects:
    no fallback to JSON, and the same columns as JSON gives."""
    from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS
    from argus_core.score.vector_columns import columns_from_result

    api = PrometheusAPI(prometheus.url)
    for expr, texts in (('argus_kernel_executions{job="llm-a"}', ("kernel",)),
                        ('argus_kernel_duration_seconds{job="llm-a"}', SUMMARY_TEXTS)):
        columns = api.query_columns(expr, SUMMARY_INTS, texts)
        reference = columns_from_result(prometheus.query(expr), SUMMARY_INTS, texts)
        assert len(columns) == len(reference) > 0
        assert np.array_equal(columns.values, reference.values)
        for name in SUMMARY_INTS:
            assert np.array_equal(columns.ints[name], reference.ints[name])
        for name in texts:
            assert columns.texts[name].strings() == reference.texts[name].strings()
    assert api.decode_fallbacks == 0


def medians_table(trace) -> PhaseTable:
    """What the scorer reads for a job, from a simulated trace: each rank's median phase and
    step times and shortest phase times (as the exporters' rolling windows give them) in step
    order."""
    from argus_core.detect.steps import step_matrix

    matrix = step_matrix(trace.steps)
    return PhaseTable(matrix.ranks, matrix.phase_names, np.nanmedian(matrix.phases, axis=1),
                      trace.coords(matrix.ranks), np.nanmedian(matrix.wall, axis=1),
                      ["node-0"] * len(matrix.ranks), np.nanmin(matrix.phases, axis=1))


@pytest.mark.parametrize("seed", range(3))
def test_pairs_and_collectives_are_published_as_the_core_finds_them(seed):
    """Comparisons PromQL cannot make come from the scorer, with the core's verdict: a pair
    member its partner waits for (tp and dp pairs), and a group whose collective is slow
    with nobody arriving late (a link, against the axis's other groups)."""
    from argus_core.detect.diagnose import diagnose
    from argus_core.simulate.faults import parse_fault
    from argus_core.simulate.model import SimConfig, simulate_trace
    from argus_core.topology import Topology

    for topology, spec, expected in (
            (Topology(dp=2, tp=2), "compute:ranks=1:phases=mlp*2:from=0",
             {(1, "mlp", "compute")}),
            (Topology(dp=2, tp=2, pp=2), "compute:ranks=6:phases=backward*1.8:from=0",
             {(6, "backward", "compute")}),
            (Topology(dp=4, tp=2), "link:ranks=2,3:axis=tp:factor=6:from=0",
             {(2, "tp-comm", "communication"), (3, "tp-comm", "communication")})):
        trace = simulate_trace(SimConfig(topology=topology, steps=30, seed=seed,
                                         faults=(parse_fault(spec),)))
        core = {(f.rank, f.phase, f.kind) for f in diagnose(trace).l2.findings}
        assert core == expected, spec
        table = medians_table(trace)
        judged = judge(JobSnapshot("sim", synthetic_summaries(0, 0), {}, table))
        assert {(f.rank, f.phase, f.kind) for f in judged.phases} == expected, spec
        for f in judged.phases:
            assert f.labels == {"host": "node-0", **{
                a: str(c) for a, c in zip(("dp", "tp", "pp", "ep"),
                                          trace.coords(np.array([f.rank]))[0], strict=True)}}


@pytest.mark.parametrize("seed", range(6))
def test_a_collective_of_microseconds_slower_than_its_peers_is_no_finding(seed):
    """A real healthy DDP job on CPU had rank 1's buffer broadcast 1.2x its peers' and paged
    ArgusLinkDegraded: a finding is published only when its excess costs the job the
    verdicts' floor (2% of a step); the same ratio on a collective that matters still is."""
    rng = np.random.default_rng(seed)
    coords = np.array([(r, 0, 0, 0) for r in range(8)])

    def judged(collective_s):
        mlp = 0.030 * (1 + 0.0002 * rng.standard_normal(8))  # arrivals together
        comm = np.full(8, collective_s) * (1 + 0.005 * rng.standard_normal(8))
        comm[1] *= 1.25  # everyone arrives together: rank 1's transfer itself is slower
        table = PhaseTable(np.arange(8), ["mlp", "dp-broadcast"], np.column_stack([mlp, comm]),
                           coords, mlp + comm, ["node-0"] * 8)
        return judge(JobSnapshot("j", synthetic_summaries(0, 0), {r: tuple(coords[r])
                                                                 for r in range(8)}, table))

    tiny = judged(0.00015)  # 150 us: +37 us a step on a 30 ms step
    assert not tiny.phases and not tiny.verdicts
    large = judged(0.010)  # 10 ms: +2.5 ms a step, 6% of the step
    assert [(f.rank, f.phase, f.kind) for f in large.phases] == [
        (1, "dp-broadcast", "communication")]
