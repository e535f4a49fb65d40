"""``argus score``: the W1 scoring job (L3), a loop of rounds behind a ``/metrics`` endpoint.

Each round lists the jobs with processors' ranks or exporters' steps in Prometheus, keeps
this shard's (a stable hash of the job name, so N scorers split a cluster without talking to
each other; with ``split="peer-set"`` every job, and of each only this shard's peer sets:
the ranks at some positions of the peer axis, which L3 compares only with each other),
fetches each job's summaries, coordinates and phase medians, judges them with the core
(``core_adapter.judge``; one thread fetches the next job meanwhile, ``fetch_ahead``) and
publishes the result atomically:
``argus_kernel_w1_score{job,rank,kernel,stream}``, ``argus_kernel_straggler`` (0/1),
``argus_verdict{job,rank,cause}``, ``argus_rank_short_of_cpu_seconds{job,rank,host}`` (a
rank's extra wait for a CPU, where it makes its slow phases host: ArgusRankShortOfCPU, and
ArgusStragglerRank leaves it out), ``argus_rank_wait_seconds{job,rank}`` (arrival skew) and
``argus_phase_straggler_ratio{job,rank,host,dp,tp,pp,ep,phase,axis,kind}``: every L2
finding of the core (``--l2-findings beyond-promql``: only those the ``promql`` recording
rules cannot make: collectives, pairs, pipeline stages), which ArgusStragglerRank and
ArgusLinkDegraded read; and the statistics the core's L2 judged with, which the recording
rules rename for the dashboards: ``argus_l2_group_median_seconds`` and
``argus_l2_group_threshold_seconds{job,axis,phase,<the group's other coordinates>}``,
``argus_l2_log_ratio_scale{job,axis,phase}``, ``argus_l2_z_family{job}`` and
``argus_scorer_l2_tests{job}``.

Nothing stale, nothing guessed: a job whose round fails in any way (a query down, past its
deadline or over its size bound, an answer of the wrong shape, a rank label that is not a
number, an error judging it) is published with nothing (its old results are dropped) and
counted in ``argus_scorer_failures_total{reason}``; the other jobs are scored all the same.
NaN and +-Inf samples are left out (read as not reported) and counted in
``argus_scorer_nonfinite_samples_total``. A rank without summaries gets no score and is
counted in ``argus_scorer_unscored_ranks``, and a failed round leaves only the scorer's own
health: ``argus_scorer_last_success_timestamp_seconds`` (what ArgusScorerStale watches), round
duration, failed queries, series fetched, answers read as plain JSON (not in Prometheus's
usual layout). Failed rounds back off (interval x 2, x 4, capped).

``serve`` takes SIGTERM and SIGINT on its main thread (``sigtimedwait``; the rounds run on
their own thread), so a stop is taken at once: the query in flight is cut (its socket shut
down), the round ends and the process exits within ``STOP_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from argus_core.detect.verdict import ranks_text
from argus_core.schema import AXES
from argus_core.score.core_adapter import (
    L2_FINDINGS,
    L2_FINDINGS_ALL,
    PROMQL_AXES,
    Judgement,
    judge,
    restrict,
)
from argus_core.score.limits import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_TIMEOUT_S
from argus_core.score.prometheus import (
    BAD_LABELS,
    QUERY_REASONS,
    PrometheusAPI,
    QueryError,
)
from argus_core.score.snapshot import JobSnapshot, fetch_job, list_jobs
from argus_core.score.vector_columns import DecodeError

logger = logging.getLogger("argus_core.score")

MAX_BACKOFF_FACTOR = 4
STOP_TIMEOUT_S = 5.0  # after SIGTERM, the longest wait for the round under way to end
HANDOVER_POLL_S = 0.1  # how often a fetched job's hand-over checks that the round goes on
ERROR = "error"  # a failure that is not a query's: a bug judging the job
FAILURE_REASONS = (*QUERY_REASONS, ERROR)  # the reason label of argus_scorer_failures_total
SPLIT_JOBS = "job"  # a shard scores whole jobs
SPLIT_PEER_SETS = "peer-set"  # a shard scores some peer sets of every job
SPLITS = (SPLIT_JOBS, SPLIT_PEER_SETS)
READ_QUERY = "query"  # kernel summaries by instant queries (any Prometheus API)
READ_EXPORT = "export"  # by victoria-metrics' /api/v1/export/csv, streamed
READS = (READ_QUERY, READ_EXPORT)
MAX_FETCH_AHEAD = 4  # each job fetched ahead is held in memory until it is judged


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` a job's failure is counted under (``FAILURE_REASONS``)."""
    if isinstance(exc, QueryError):
        return exc.reason
    if isinstance(exc, DecodeError):
        return BAD_LABELS
    return ERROR


@dataclass(frozen=True)
class ScoreConfig:
    """Everything ``argus score`` can be told."""

    prometheus: str
    interval_s: float = 60.0
    shard: int = 0
    shards: int = 1
    split: str = SPLIT_JOBS  # what the shards divide: whole jobs, or each job's peer sets
    peer_axis: str = "pp"
    window_s: float = 60.0  # the processors' --window: their summaries cover this much time
    rate_window: str = "2m"  # steps per second of each rank, over this window
    timeout_s: float = DEFAULT_TIMEOUT_S  # per query attempt: connect, send, whole answer
    selector: str = ""  # extra matchers on the processors' and exporters' series
    l2_findings: str = L2_FINDINGS_ALL  # which L2 findings to publish (core_adapter)
    promql_axes: tuple[str, ...] = PROMQL_AXES  # beyond-promql: the axes the rules compare
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES  # longest answer read per query
    read: str = READ_QUERY  # how the summaries and phase windows are read (READS)
    lookback_s: float = 30.0  # READ_EXPORT: a series' last sample within this many seconds
    fetch_ahead: int = 1  # jobs fetched while the one before is judged (0: one at a time)

    def __post_init__(self) -> None:
        if self.l2_findings not in L2_FINDINGS:
            raise ValueError(f"--l2-findings {self.l2_findings!r}: expected one of "
                             f"{', '.join(L2_FINDINGS)}")
        if self.read not in READS:
            raise ValueError(f"--read {self.read!r}: expected one of {', '.join(READS)}")
        if self.split not in SPLITS:
            raise ValueError(f"--split {self.split!r}: expected one of {', '.join(SPLITS)}")
        if not 0 <= self.shard < self.shards:
            raise ValueError(f"--shard {self.shard}/{self.shards}: expected I/N with "
                             f"0 <= I < N")
        for flag, seconds in (("--interval", self.interval_s), ("--timeout", self.timeout_s),
                              ("--window", self.window_s), ("--lookback", self.lookback_s)):
            if not (math.isfinite(seconds) and seconds > 0):  # NaN fails every comparison
                raise ValueError(f"{flag} {seconds}: expected a finite number of seconds > 0")
        if self.max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes {self.max_answer_bytes}: expected > 0")
        if not 0 <= self.fetch_ahead <= MAX_FETCH_AHEAD:
            raise ValueError(f"--fetch-ahead {self.fetch_ahead}: expected 0 to "
                             f"{MAX_FETCH_AHEAD} jobs")


def shard_of(job: str, shards: int) -> int:
    """The shard that scores ``job``: CRC-32 of its name, stable across runs and hosts."""
    return zlib.crc32(job.encode()) % shards


def peer_set_shard(job: str, position: int, shards: int) -> int:
    """The shard that scores one peer set of ``job`` (``split="peer-set"``): consecutive
    positions on consecutive shards from the job's own ``shard_of``, so a job's peer sets
    spread evenly and its job-wide statistics stay with the shard of its peer set 0."""
    return (shard_of(job, shards) + position) % shards


@dataclass
class Published:
    """What /metrics serves: the last round's judgements plus the scorer's health."""

    judgements: dict[str, Judgement] = field(default_factory=dict)
    last_success: float = 0.0
    round_seconds: float = float("nan")
    rounds_ok: int = 0
    rounds_failed: int = 0
    query_failures: int = 0
    series_fetched: int = 0
    jobs_failed: int = 0
    decode_fallbacks: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # by reason, since the start
    nonfinite_samples: int = 0


class Scorer:
    """Runs rounds; ``published`` is replaced as a whole, so a scrape sees one round."""

    def __init__(self, config: ScoreConfig, api: PrometheusAPI | None = None):
        self.config = config
        self.api = api or PrometheusAPI(config.prometheus, timeout_s=config.timeout_s,
                                        max_answer_bytes=config.max_answer_bytes)
        self.published = Published()
        self._stop = threading.Event()

    def run_round(self) -> bool:
        """Score every job of this shard once; True when every job was scored. A job whose
        queries or judgement fail in any way is left out (counted by reason); the others
        are scored all the same."""
        started = time.monotonic()
        previous = self.published
        api = self.api
        api.series_fetched = 0
        failures_before = api.failures
        failures = dict(previous.failures)
        judgements: dict[str, Judgement] = {}
        jobs_failed = 0
        try:
            jobs = [j for j in list_jobs(api, self.config.selector)
                    if self.config.split == SPLIT_PEER_SETS
                    or shard_of(j, self.config.shards) == self.config.shard]
        except Exception as exc:  # whatever the answer, the round is counted
            _count(failures, exc, "cannot list jobs")
            jobs = None
        taken = 0
        with fetched_ahead(jobs or [], self._fetch, self.config.fetch_ahead,
                           self._stop) as fetched:
            for job, snapshot, error in fetched:
                if self._stop.is_set():
                    break
                taken += 1
                try:
                    if error is not None:
                        raise error
                    judgement = self._judge(job, snapshot)
                    if judgement.lead or judgement.peer_sets:  # else none of it is ours
                        judgements[job] = judgement
                except Exception as exc:  # one job's failure is only that job's
                    _count(failures, exc, f"job {job!r} left out this round")
                    jobs_failed += 1
        if taken < len(jobs or ()):  # stopped: the rest of the round is left out
            jobs_failed += 1
        ok = jobs is not None and jobs_failed == 0
        self.published = Published(
            judgements=judgements,
            last_success=time.time() if ok else previous.last_success,
            round_seconds=time.monotonic() - started,
            rounds_ok=previous.rounds_ok + ok, rounds_failed=previous.rounds_failed + (not ok),
            query_failures=previous.query_failures + api.failures - failures_before,
            series_fetched=api.series_fetched, jobs_failed=jobs_failed,
            decode_fallbacks=api.decode_fallbacks, failures=failures,
            nonfinite_samples=api.nonfinite_samples)
        return ok

    def _owns(self, job: str) -> Callable[[int], bool] | None:
        """Which peer-set positions of ``job`` are this shard's (None: all of them)."""
        config = self.config
        if config.split != SPLIT_PEER_SETS or config.shards < 2:
            return None
        return lambda position: peer_set_shard(job, position, config.shards) == config.shard

    def _fetch(self, job: str) -> JobSnapshot:
        """Fetch one job: this shard's peer sets of it."""
        config = self.config
        return fetch_job(self.api, job, config.selector, config.window_s,
                         config.rate_window, config.peer_axis, self._owns(job),
                         config.lookback_s if config.read == READ_EXPORT else None)

    def _judge(self, job: str, snapshot: JobSnapshot) -> Judgement:
        """Judge one fetched job with the core."""
        config = self.config
        owns = self._owns(job)
        judgement = judge(snapshot, config.peer_axis, config.l2_findings, config.promql_axes)
        return restrict(judgement, snapshot, config.peer_axis,
                        lead=owns is None or owns(0))

    def run_forever(self) -> None:
        """Rounds every ``interval_s``; after failures, every 2, then 4 intervals (capped)."""
        streak = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                ok = self.run_round()
            except Exception as exc:  # a bug must not stop the service
                self._publish_nothing(exc)
                ok = False
            streak = 0 if ok else streak + 1
            wait = self.config.interval_s * min(2 ** streak, MAX_BACKOFF_FACTOR)
            self._stop.wait(max(0.0, wait - (time.monotonic() - started)))

    def _publish_nothing(self, exc: Exception) -> None:
        """A round that raised: its findings are dropped and the failure counted."""
        previous = self.published
        failures = dict(previous.failures)
        _count(failures, exc, "round failed")
        self.published = Published(last_success=previous.last_success,
                                   rounds_ok=previous.rounds_ok,
                                   rounds_failed=previous.rounds_failed + 1,
                                   query_failures=previous.query_failures,
                                   decode_fallbacks=previous.decode_fallbacks,
                                   failures=failures,
                                   nonfinite_samples=previous.nonfinite_samples)

    def stop(self) -> None:
        """End ``run_forever``: the query in flight is cut and no other is made."""
        self._stop.set()
        self.api.close()

    def collect(self):
        """Prometheus collector: the published round and the scorer's health."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = self.published
        score = GaugeMetricFamily(
            "argus_kernel_w1_score", "Extra time of the rank's kernel over its healthy peers' "
            "(directional W1 / reference mean; 0.5 = 50% slower).",
            labels=["job", "rank", "kernel", "stream"])
        straggler = GaugeMetricFamily(
            "argus_kernel_straggler", "1 when the kernel is a finding (slow, not explained by "
            "waiting for a late peer), else 0.", labels=["job", "rank", "kernel", "stream"])
        verdict = GaugeMetricFamily("argus_verdict", "The most likely cause for a rank (1).",
                                    labels=["job", "rank", "cause"])
        short_of_cpu = GaugeMetricFamily(
            "argus_rank_short_of_cpu_seconds", "Seconds a step the rank's training thread "
            "waited for a CPU beyond the other ranks', for each rank whose slow phases this "
            "explains (its verdict is host, not compute).", labels=["job", "rank", "host"])
        wait = GaugeMetricFamily("argus_rank_wait_seconds", "Time per step the rank waits in "
                                 "collectives for late peers (arrival skew).",
                                 labels=["job", "rank"])
        phases = GaugeMetricFamily(
            "argus_phase_straggler_ratio", "A rank's phase time over its group's median (its "
            "partner's for a pair; collectives: transfer time, waiting for late arrivers "
            "removed), for each L2 finding of the core.",
            labels=["job", "rank", "host", *AXES, "phase", "axis", "kind"])
        tests = GaugeMetricFamily("argus_scorer_l2_tests", "Statistics the core's L2 judged "
                                  "for the job (the N of its family-wise threshold).",
                                  labels=["job"])
        median, threshold = (GaugeMetricFamily(
            f"argus_l2_group_{what}_seconds", f"{doc} of the axis group (labels: its other "
            f"coordinates) in a compute phase, from the core's L2 (groups of three or more).")
            for what, doc in (("median", "Median phase time"),
                              ("threshold", "Phase time from which a member is a finding")))
        scale = GaugeMetricFamily("argus_l2_log_ratio_scale", "Spread of ln(time / group "
                                  "median) pooled over the axis's groups (never below the "
                                  "core's scale floor).", labels=["job", "axis", "phase"])
        z_family = GaugeMetricFamily("argus_l2_z_family", "The z every L2 statistic of the "
                                     "job must reach: max(z threshold, Phi^-1(1 - alpha / N)).",
                                     labels=["job"])
        unscored = GaugeMetricFamily("argus_scorer_unscored_ranks", "Ranks known to a "
                                     "processor that got no score this round (no summaries "
                                     "or too few peers).", labels=["job"])
        peer_sets = GaugeMetricFamily(
            "argus_scorer_peer_set_info", "A peer set (the ranks at one position of the peer "
            "axis) whose kernels this shard scored and whose ranks' results it publishes "
            "(--split peer-set; value 1).", labels=["job", "axis", "position"])
        suspect = GaugeMetricFamily(
            "argus_suspect", "Flagged ranks a hardware unit explains (the smallest unit they "
            "share and healthy ranks do not; shared=false: one rank's own GPU or NIC).",
            labels=["job", "unit_kind", "unit", "cause"])
        suspect_info = GaugeMetricFamily(
            "argus_suspect_info", "What an alert on argus_suspect says: the unit's flagged "
            "ranks and hosts, healthy ranks under it, whether it is shared (value 1).",
            labels=["job", "unit_kind", "unit", "cause", "shared", "ranks", "hosts",
                    "healthy_under"])
        suspect_cost = GaugeMetricFamily(
            "argus_suspect_cost_seconds", "What a suspect unit costs the job a step: the "
            "largest per-step cost of its ranks' verdicts (the step would be this much "
            "shorter without them).", labels=["job", "unit_kind", "unit", "cause"])
        for job, judgement in sorted(state.judgements.items()):
            for s in judgement.suspects:
                key = [job, s.unit_kind, s.unit, s.cause]
                suspect.add_metric(key, float(len(s.ranks)))
                if s.cost_s is not None:
                    suspect_cost.add_metric(key, s.cost_s)
                suspect_info.add_metric(
                    [*key, str(s.shared).lower(), ranks_text(s.ranks), _hosts_text(s.hosts),
                     str(s.healthy)], 1.0)
            table = judgement.kernels
            rows = zip(table.rank.tolist(), table.kernel.tolist(), table.stream.tolist(),
                       table.score.tolist(), table.straggler.tolist(), strict=True)
            for rank, kernel, stream, value, flag in rows:
                labels = [job, str(rank), table.names[kernel], str(stream)]
                score.add_metric(labels, value)
                straggler.add_metric(labels, float(flag))
            for rank, cause in judgement.verdicts:
                verdict.add_metric([job, str(rank), cause], 1.0)
            hosts = {f.rank: f.labels["host"] for f in judgement.phases}
            for rank, seconds in sorted(judgement.short_of_cpu.items()):
                short_of_cpu.add_metric([job, str(rank), hosts.get(rank, "")], seconds)
            for rank, seconds in sorted(judgement.wait_s.items()):
                wait.add_metric([job, str(rank)], seconds)
            for f in judgement.phases:
                phases.add_metric([job, str(f.rank), f.labels["host"],
                                   *(f.labels[a] for a in AXES), f.phase, f.axis, f.kind],
                                  min(f.ratio, 1e6))
            for row in judgement.groups:  # label sets differ by axis: samples by hand
                labels = {"job": job, "axis": row.axis, "phase": row.phase, **row.labels}
                median.add_sample(median.name, labels, row.median)
                threshold.add_sample(threshold.name, labels, row.threshold)
            for axis, phase, value in judgement.scales:
                scale.add_metric([job, axis, phase], value)
            if judgement.l2_tests:
                z_family.add_metric([job], judgement.z_family)
            if judgement.lead:
                tests.add_metric([job], judgement.l2_tests)
            unscored.add_metric([job], len(judgement.unscored))
            for position in judgement.peer_sets or ():
                peer_sets.add_metric([job, self.config.peer_axis, str(position)], 1.0)
        yield from (score, straggler, verdict, short_of_cpu, wait, phases, median, threshold,
                    scale, z_family, tests, unscored, peer_sets, suspect, suspect_info,
                    suspect_cost)

        def gauge(name: str, doc: str, value: float):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        yield gauge("argus_scorer_last_success_timestamp_seconds",
                    "Unix time of the last round in which every query succeeded.",
                    state.last_success)
        yield gauge("argus_scorer_round_duration_seconds", "Duration of the last round.",
                    state.round_seconds)
        yield gauge("argus_scorer_series_fetched", "Series fetched from Prometheus in the "
                    "last round.", state.series_fetched)
        yield gauge("argus_scorer_jobs", "Jobs scored in the last round.",
                    len(state.judgements))
        yield gauge("argus_scorer_jobs_failed", "Jobs left out of the last round (a query or "
                    "the judgement failed).", state.jobs_failed)
        rounds = CounterMetricFamily("argus_scorer_rounds", "Rounds, by result.",
                                     labels=["result"])
        rounds.add_metric(["ok"], state.rounds_ok)
        rounds.add_metric(["failed"], state.rounds_failed)
        yield rounds
        failures = CounterMetricFamily("argus_scorer_query_failures",
                                       "Failed query attempts (each retry counts).")
        failures.add_metric([], state.query_failures)
        yield failures
        fallbacks = CounterMetricFamily(
            "argus_scorer_decode_fallbacks", "Answers not in Prometheus's usual layout, read "
            "as plain JSON (slower; same result).")
        fallbacks.add_metric([], state.decode_fallbacks)
        yield fallbacks
        failed = CounterMetricFamily(
            "argus_scorer_failures", "Jobs left out of a round, and rounds that could not "
            "list the jobs, by reason (unreachable, http_status, deadline, too_large, "
            "bad_answer, bad_labels, stopped, error).", labels=["reason"])
        for reason in FAILURE_REASONS:
            failed.add_metric([reason], state.failures.get(reason, 0))
        yield failed
        nonfinite = CounterMetricFamily(
            "argus_scorer_nonfinite_samples", "NaN or +-Inf samples in Prometheus's answers, "
            "left out (the series is read as not reported).")
        nonfinite.add_metric([], state.nonfinite_samples)
        yield nonfinite
        shard = GaugeMetricFamily("argus_scorer_shard_info", "This scorer's shard, what "
                                  "the shards split and how it reads the kernel summaries "
                                  "and phase windows (value 1).",
                                  labels=["shard", "shards", "split", "read"])
        shard.add_metric([str(self.config.shard), str(self.config.shards), self.config.split,
                          self.config.read], 1.0)
        yield shard


@contextlib.contextmanager
def fetched_ahead(jobs: list[str], fetch: Callable[[str], JobSnapshot], ahead: int,
                  stop: threading.Event) -> Iterator[Iterator[tuple[str, JobSnapshot | None,
                                                                     Exception | None]]]:
    """``(job, snapshot, None)`` or ``(job, None, error)`` for each job in order; with
    ``ahead`` >= 1 one thread fetches the jobs (all queries of a round from that one
    thread), at most ``ahead`` beyond the one being judged, so that fetching (mostly waiting
    on the engine and decoding) and judging overlap. On leaving, the thread is told to stop
    and joined: a fetch under way ends within its deadline, or at once when ``stop()`` closed
    the connection. A round of one job (or none) has nothing to overlap: no thread."""
    if ahead < 1 or len(jobs) < 2:
        yield ((job, *_attempt(fetch, job)) for job in jobs)
        return
    ready: queue.Queue = queue.Queue(maxsize=ahead)
    left = threading.Event()

    def fetch_all() -> None:
        for job in jobs:
            if left.is_set() or stop.is_set():
                break
            outcome = (job, *_attempt(fetch, job))
            while not left.is_set():  # the consumer takes it, or has gone
                try:
                    ready.put(outcome, timeout=HANDOVER_POLL_S)
                    break
                except queue.Full:
                    continue

    thread = threading.Thread(target=fetch_all, name="argus-score-fetch", daemon=True)
    thread.start()

    def taken() -> Iterator[tuple[str, JobSnapshot | None, Exception | None]]:
        for _ in jobs:
            while True:
                try:
                    yield ready.get(timeout=HANDOVER_POLL_S)
                    break
                except queue.Empty:
                    if not thread.is_alive() and ready.empty():
                        return  # stopped before this job
    try:
        yield taken()
    finally:
        left.set()
        thread.join()


def _attempt(fetch: Callable[[str], JobSnapshot], job: str,
             ) -> tuple[JobSnapshot | None, Exception | None]:
    try:
        return fetch(job), None
    except Exception as exc:  # one job's failure is only that job's: counted when judged
        return None, exc


def _hosts_text(hosts: tuple[str, ...]) -> str:
    """Hosts for a label value: the first eight, then how many more."""
    return ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")


def _count(failures: dict[str, int], exc: Exception, what: str) -> None:
    """Count a failure under its reason and log it (with the traceback for a bug)."""
    reason = failure_reason(exc)
    failures[reason] = failures.get(reason, 0) + 1
    if reason == ERROR:
        logger.exception("argus score: %s", what)
    else:
        logger.warning("argus score: %s (%s): %s", what, reason, exc)


def serve(config: ScoreConfig, host: str, port: int) -> None:
    """Serve /metrics and run rounds until SIGTERM/SIGINT.

    The signals are blocked in every thread and taken by the main thread with
    ``sigtimedwait``: no handler runs in the middle of a round (nor takes a lock there), and a
    stop is not left waiting for a query. The rounds run on a daemon thread; a stop cuts the
    query in flight and waits at most ``STOP_TIMEOUT_S`` for the round to end."""
    import signal

    from prometheus_client import CollectorRegistry, start_http_server

    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # threads started below inherit it
    scorer = Scorer(config)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(scorer)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    logger.info("argus score: /metrics on http://%s:%d, Prometheus %s, shard %d/%d", host,
                server.server_port, config.prometheus, config.shard, config.shards)
    rounds = threading.Thread(target=scorer.run_forever, name="argus-score-rounds",
                              daemon=True)
    rounds.start()
    try:
        while rounds.is_alive():
            taken = signal.sigtimedwait(signals, 1.0)
            if taken is not None:
                logger.info("argus score: %s, stopping", signal.Signals(taken.si_signo).name)
                break
    finally:
        scorer.stop()
        rounds.join(STOP_TIMEOUT_S)
        server.shutdown()
