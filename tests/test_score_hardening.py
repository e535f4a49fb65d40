"""``argus score`` against a hostile Prometheus: the scorer never serves what it cannot vouch
for. A proxy in front of the real Prometheus (Debian's) answers chosen queries the way a broken
store or an attacker would (a JSON list, a string result, a rank that is not a number, +Inf
samples, an answer trickled a byte at a time, a 100 MB answer); the scorer must drop that
job's findings and count why, keep scoring the other job, skip non-finite samples, bound each
query in time and in size, and stop on SIGTERM even mid-query."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from prom_support import PhaseCluster, Prometheus, serve_collectors
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, wait_for

from argus_core.cli import main
from argus_core.score.service import ScoreConfig, Scorer

RANKS = 8
SLOW_RANK = 5  # slow in both jobs: each job has findings to lose
HEALTHY_RANK = 3
JOBS = ("llm-a", "llm-b")
FINDINGS = ("argus_phase_straggler_ratio", "argus_verdict", "argus_kernel_straggler")
MiB = 1 << 20


Action = Callable[["HostileProxy", BaseHTTPRequestHandler, bytes], None]


class HostileProxy:
    """Plays Prometheus: forwards every query to the real one and passes its answer on, except
    for the queries ``rule``'s predicate picks, which its action answers instead (it gets
    the real answer's bytes)."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.rule: tuple[Callable[[str], bool], Action] | None = None
        self.trickling = threading.Event()  # a trickled answer is under way
        self.trickles = 0
        self.closed = threading.Event()
        self.sent_bytes: list[int] = []  # of each huge answer, until the client hung up
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                proxy.handle(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        expr = urllib.parse.parse_qs(body.decode())["query"][0]
        request = urllib.request.Request(
            f"{self.upstream}/api/v1/query", data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(request, timeout=30) as response:
            real = response.read()
        rule = self.rule
        try:
            if rule is not None and rule[0](expr):
                rule[1](self, handler, real)
            else:
                reply(handler, real)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scorer hung up

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


def reply(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def answer(body: bytes) -> Action:
    """Answer these bytes instead."""
    return lambda proxy, handler, real: reply(handler, body)


def rewrite(change: Callable[[dict], None]) -> Action:
    """The real answer, with ``change`` applied to each series (Prometheus's layout kept)."""
    def act(proxy, handler, real):
        document = orjson.loads(real)
        for series in document["data"]["result"]:
            change(series)
        reply(handler, orjson.dumps(document))
    return act


def trickle(proxy: HostileProxy, handler: BaseHTTPRequestHandler, real: bytes) -> None:
    """200 and the headers at once, then the answer one byte every half second (for a
    minute at most)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(real)))
    handler.end_headers()
    handler.wfile.flush()
    proxy.trickles += 1
    proxy.trickling.set()
    until = time.monotonic() + 60
    for i in range(len(real)):
        if proxy.closed.wait(0.5) or time.monotonic() > until:
            return
        handler.wfile.write(real[i:i + 1])
        handler.wfile.flush()


def huge(size: int, announced: bool) -> Action:
    """An answer of ``size`` bytes (a valid header, then spaces), its length announced in a
    Content-Length or not (read until the connection closes)."""
    def act(proxy, handler, real):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if announced:
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        chunk = b" " * MiB
        sent = 0
        try:
            handler.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
            while sent < size and not proxy.closed.is_set():
                handler.wfile.write(chunk)
                sent += len(chunk)
        finally:
            proxy.sent_bytes.append(sent)
    return act


def query_of(metric: str, job: str, *parts: str) -> Callable[[str], bool]:
    """Picks the queries of ``metric`` for ``job`` whose text has every one of ``parts``."""
    return lambda expr: (expr.startswith(metric) and f'job="{job}"' in expr
                         and all(p in expr for p in parts))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    server, target = serve_collectors(PhaseCluster(RANKS, dict.fromkeys(JOBS, SLOW_RANK)))
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), {"cluster": target}).start()
    prom.wait_for("argus_kernel_executions", count=len(JOBS) * RANKS * 4)
    prom.wait_for("increase(argus_steps_total[5s]) > 0", count=len(JOBS) * RANKS)
    yield prom
    prom.stop()
    server.shutdown()


@pytest.fixture(scope="module")
def hostile(upstream):
    proxy = HostileProxy(upstream.url)
    yield proxy
    proxy.close()


@pytest.fixture
def proxy(hostile):
    hostile.rule = None
    hostile.trickling.clear()
    hostile.trickles = 0
    hostile.sent_bytes.clear()
    yield hostile
    hostile.rule = None


def config(url: str, timeout_s: float = 10) -> ScoreConfig:
    return ScoreConfig(prometheus=url, interval_s=1, window_s=60, rate_window="5s",
                       timeout_s=timeout_s)


Samples = dict[str, list[tuple[dict, float]]]


def samples(scorer: Scorer) -> Samples:
    """What the scorer's /metrics would serve, by sample name."""
    out: Samples = {}
    for family in scorer.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def findings(out: Samples, job: str) -> set[tuple[str, str]]:
    """(series, rank) of every finding served for ``job``."""
    return {(name, labels["rank"]) for name in FINDINGS for labels, value in out.get(name, ())
            if labels["job"] == job and (name != "argus_kernel_straggler" or value == 1)}


SLOW = {(name, str(SLOW_RANK)) for name in FINDINGS}


def by_label(out: Samples, name: str, label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in out.get(name, ())}


def first_round(scorer: Scorer) -> None:
    """A clean round: both jobs' findings served (what a later failure must take away)."""
    assert scorer.run_round()
    out = samples(scorer)
    assert findings(out, "llm-a") == findings(out, "llm-b") == SLOW


def _rank_to(text: str) -> Callable[[dict], None]:
    def change(series):
        if series["metric"]["rank"] == str(HEALTHY_RANK):
            series["metric"]["rank"] = text
    return change


@pytest.mark.parametrize(("case", "rule", "reason"), [
    ("a JSON list", (query_of("argus_rank_info", "llm-b"),
                     answer(b'[{"status":"success","data":{}}]')), "bad_answer"),
    ("a result that is a string", (query_of("argus_rank_info", "llm-b"), answer(orjson.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": "argus"}}))),
     "bad_answer"),
    ('rank="worker-7"', (query_of("argus_phase_window_seconds", "llm-b", 'stat="median"'),
                         rewrite(_rank_to("worker-7"))), "bad_labels"),
], ids=["list", "string-result", "rank-worker-7"])
def test_a_bad_answer_drops_its_jobs_findings_counts_why_and_spares_the_other(
        proxy, case, rule, reason):
    """One job's answer is unreadable: that job's findings of the last round are no longer
    served, the failure is counted under its reason and the round as failed, the other job is
    scored as before; once the answers are sound again, so is the job."""
    scorer = Scorer(config(proxy.url))
    first_round(scorer)
    proxy.rule = rule
    assert not scorer.run_round(), case
    out = samples(scorer)
    assert findings(out, "llm-b") == set(), case
    assert not [s for s, _ in out.get("argus_kernel_w1_score", ()) if s["job"] == "llm-b"]
    assert findings(out, "llm-a") == SLOW, case
    failures = by_label(out, "argus_scorer_failures_total", "reason")
    assert failures[reason] == 1 and sum(failures.values()) == 1, failures
    assert by_label(out, "argus_scorer_rounds_total", "result") == {"ok": 1, "failed": 1}
    proxy.rule = None
    assert scorer.run_round()
    assert findings(samples(scorer), "llm-b") == SLOW


def test_non_finite_samples_are_skipped_and_counted_never_paged(proxy):
    """A +Inf phase median and a +Inf kernel p50 for a healthy rank: both samples are left out
    (the rank's mlp and that cluster read as not reported) and counted; the rank gets no
    straggler ratio (never the 1e6 cap), no verdict, no kernel finding, and the real
    straggler of the same job is still found."""
    poisoned = []

    def change(series):
        metric = series["metric"]
        if metric["rank"] != str(HEALTHY_RANK):
            return
        if metric.get("phase") == "mlp" or (
                metric["__name__"] == "argus_kernel_duration_seconds"
                and metric.get("quantile") == "0.5"
                and "argus_kernel_duration_seconds" not in poisoned):
            series["value"][1] = "+Inf"
            poisoned.append(metric["__name__"])

    medians = query_of("argus_phase_window_seconds", "llm-a", 'stat="median"')
    durations = query_of("argus_kernel_duration_seconds", "llm-a")
    proxy.rule = (lambda expr: medians(expr) or durations(expr), rewrite(change))
    scorer = Scorer(config(proxy.url))
    assert scorer.run_round()
    assert sorted(poisoned) == ["argus_kernel_duration_seconds", "argus_phase_window_seconds"]
    out = samples(scorer)
    assert findings(out, "llm-a") == SLOW
    ratios = [v for _, v in out["argus_phase_straggler_ratio"]]
    assert max(ratios) < 10, ratios
    assert out["argus_scorer_nonfinite_samples_total"][0][1] == 2


def test_a_trickling_answer_is_cut_at_the_deadline(proxy):
    """An answer that starts at once and then comes a byte every half second: each attempt
    ends at --timeout (connect, send and the whole answer, not per read), the job's stale
    findings are dropped and the deadline counted, the other job is scored."""
    scorer = Scorer(config(proxy.url))
    first_round(scorer)
    deadline = scorer.api.timeout_s = 2.0
    proxy.rule = (query_of("argus_rank_info", "llm-b"), trickle)
    result: list[bool] = []
    started = time.monotonic()
    rounds = threading.Thread(target=lambda: result.append(scorer.run_round()), daemon=True)
    rounds.start()
    rounds.join(30)
    elapsed = time.monotonic() - started
    assert result == [False], f"the round still runs after {elapsed:.0f} s"
    assert proxy.trickles == 3  # three attempts, 0.25 and 0.5 s apart
    assert elapsed < 3 * deadline + 0.75 + 5, elapsed
    out = samples(scorer)
    assert findings(out, "llm-b") == set()
    assert findings(out, "llm-a") == SLOW
    assert by_label(out, "argus_scorer_failures_total", "reason")["deadline"] == 1
    assert out["argus_scorer_query_failures_total"][0][1] == 3


class ScorerProcess:
    """``argus score`` as users start it, in its own process, against ``url``."""

    def __init__(self, url: str, workdir: Path, *flags: str):
        self.port = free_port()
        self.log = workdir / "scorer.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "argus_core.cli", "score", "--prometheus", url,
             "--listen", f"127.0.0.1:{self.port}", "--interval", "1", "--window", "60",
             "--rate-window", "5s", *flags],
            cwd=workdir, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def metrics(self) -> Samples:
        """Its /metrics, by sample name (empty while it does not answer)."""
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return {}
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out

    def memory_kb(self, field: str) -> int:
        """``VmRSS`` or ``VmHWM`` (the peak) from /proc, in kB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def start_scorer(tmp_path):
    started: list[ScorerProcess] = []

    def start(url: str, *flags: str) -> ScorerProcess:
        scorer = ScorerProcess(url, tmp_path, *flags)
        started.append(scorer)
        return scorer

    yield start
    for scorer in started:
        scorer.stop()


def served_both(scorer: ScorerProcess) -> bool:
    out = scorer.metrics()
    return findings(out, "llm-a") == findings(out, "llm-b") == SLOW


def test_sigterm_mid_query_exits_within_seconds(proxy, start_scorer):
    """SIGTERM while a query is trickling in (deadline 60 s): the query is cut, the scorer
    exits 0 within 5 s."""
    scorer = start_scorer(proxy.url, "--timeout", "60")
    wait_for(lambda: served_both(scorer), "a first round served")
    proxy.rule = (query_of("argus_rank_info", "llm-b"), trickle)
    wait_for(proxy.trickling.is_set, "a query trickling in")
    sent = time.monotonic()
    scorer.process.send_signal(signal.SIGTERM)
    try:
        code = scorer.process.wait(30)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - sent
    assert code == 0 and took < 5, (code, took, scorer.log.read_text()[-2000:])


@pytest.mark.parametrize("announced", [False, True], ids=["until-close", "content-length"])
def test_a_100_mb_answer_is_refused_at_the_bound_and_memory_stays_flat(
        proxy, start_scorer, announced):
    """A 100 MB answer to one of a job's queries, against --max-answer-mb 16: at most the
    bound is read (or nothing, when a Content-Length announces more), the job fails as
    too_large and its findings are dropped, the other job is scored, and the scorer's peak
    RSS grows by less than 64 MB."""
    scorer = start_scorer(proxy.url, "--timeout", "20", "--max-answer-mb", "16")
    wait_for(lambda: served_both(scorer), "a first round served")
    peak_before = scorer.memory_kb("VmHWM")
    proxy.rule = (query_of("argus_rank_info", "llm-b"), huge(100 * MiB, announced))

    def refused() -> Samples:
        out = scorer.metrics()
        failed = by_label(out, "argus_scorer_failures_total", "reason").get("too_large", 0)
        return out if failed >= 1 and not findings(out, "llm-b") else {}

    out = wait_for(refused, "the 100 MB answer refused as too_large")
    assert findings(out, "llm-a") == SLOW
    growth_mb = (scorer.memory_kb("VmHWM") - peak_before) / 1024
    assert growth_mb < 64, growth_mb
    sent = wait_for(lambda: proxy.sent_bytes, "the proxy's answer ended")
    assert max(sent) < 100 * MiB  # the scorer hung up
    log = scorer.log.read_text()
    assert "bound of 16 MiB per answer (--max-answer-mb)" in log


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-answer-mb", "0"], "--max-answer-mb 0: expected a whole number of MiB >= 1"),
    (["--timeout", "0"], "--timeout 0.0: expected a finite number of seconds > 0"),
    (["--timeout", "inf"], "--timeout inf: expected a finite number of seconds > 0"),
    (["--read", "export", "--lookback", "-5"],
     "--lookback -5.0: expected a finite number of seconds > 0"),
])
def test_cli_refuses_bad_bounds_naming_the_flag(argv, message, capsys):
    assert main(["score", "--prometheus", "http://127.0.0.1:9090", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_failed_long_query_is_named_in_one_short_line():
    """A peer set's rank regex makes queries of kilobytes: an error names the query's start
    and its length, not all of it."""
    from argus_core.score.prometheus import PrometheusAPI, QueryError, shown

    api = PrometheusAPI(f"http://127.0.0.1:{free_port()}", timeout_s=1, attempts=1)
    expr = 'argus_kernel_executions{job="a",rank=~"' + "|".join(map(str, range(3000))) + '"}'
    with pytest.raises(QueryError) as failure:
        api.query(expr)
    message = str(failure.value)
    assert len(message) < 600 and f"({len(expr)} characters)" in message
    assert message.startswith(repr(expr[:40])[:-1])
    assert shown("up") == "'up'"
