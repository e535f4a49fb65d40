"""Benchmark: every Argus rule group in a real Prometheus fed 10,000 ranks x 8 phases, and the
scorer's round at 10,000 ranks x 100 kernels.

    python bench/rules_scale.py [--ranks 10000] [--minutes 5] [--kernels 100]
                                [--l2-source scorer|promql] [--json]
    python bench/rules_scale.py --scorer-only [--json]   # the scorer's parse and compute only

Rules. A synthetic exporter serves, for every rank, the series the exporters expose (the
names, labels and kinds are taken from ``StepMetrics`` itself for one rank, then repeated
with each rank's identity), over ``--targets`` scrape targets; values advance with time, one
rank is a 2x mlp straggler. A further target serves what the scorer publishes for that job
(its own ``judge`` and collector on the ranks' phase table: every L2 finding and the group
statistics the ``l2_source: scorer`` rules rename, ~36,000 series at 10,000 ranks).
Prometheus (Debian's 2.42) scrapes them every 15 s and evaluates all Argus rule groups
(``--l2-source``: the rules' L2 mode, default the rules' default; production config: the
step-level groups every 15 s, the L2, trend and pipeline groups every 60 s). After the rate
windows have filled (2.5 min), ``prometheus_rule_group_last_duration_seconds`` is sampled
every 15 s:
``rule_eval_seconds`` is the largest sum over groups seen (every group's last evaluation, as
if all ran in the same 15 s), ``rule_eval_seconds_per_15s`` the evaluation time that falls in
one 15 s interval on average (each group's duration x 15 s / its interval), with
``prometheus_rule_group_iterations_missed_total``. Baseline in the same run: a ``count()``
over the 80,000 phase-median series through the HTTP API (the issue's calibration: 0.4-0.5 s).

Scorer. (a) compute: the Prometheus API answers for 10,000 ranks x ``--kernels`` kernels x 2
clusters (synthetic summaries, one rank 2x slow) are rendered as Prometheus renders them;
``scorer_parse_seconds`` is decoding them into label columns as the scorer does
(``PrometheusAPI.query_columns``; ``scorer_decode_fallbacks`` counts answers it had to read as
plain JSON), ``scorer_compute_seconds`` the rebuild of the summary table from the columns plus
the core's scoring (L3, and L2 on the ranks' phase table) and verdicts. The user waits for
both (and the query): report their sum.
(b) query: the same Prometheus also scrapes kernel summaries for 10,000 ranks x
``--query-kernels`` kernels (as the processor exposes them); ``scorer_query_seconds`` is the
scorer's real fetch of one job through the HTTP API and ``scorer_fetched_series`` what it
fetched (the full 100 kernels would need ~6 M series in one Prometheus, beyond this machine).

One script past 500 lines on purpose: the synthetic exporter, the engine's start and the
scorer's measurement share their scale settings and run as one benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import orjson
from _report import report

from argus_core.rules.alerts import alert_groups
from argus_core.rules.config import L2_SOURCES, RulesConfig
from argus_core.rules.generate import to_yaml
from argus_core.rules.recording import recording_groups
from argus_core.schema import AXES
from argus_core.score.core_adapter import judge
from argus_core.score.snapshot import JobSnapshot, PhaseTable, kernel_summary
from argus_core.simulate.summaries import synthetic_summaries
from argus_core.stack.processes import free_port, start_child, stop_child
from argus_core.summaries import summary_families
from argus_core.topology import Topology

PHASES = {"attention": 0.018, "mlp": 0.030, "backward": 0.087, "optimizer": 0.006,
          "tp-comm": 0.004, "ep-alltoall": 0.003, "pp-p2p": 0.001, "dp-allreduce": 0.013}
TOPOLOGY = {10_000: Topology(tp=4, ep=2, pp=5, dp=250)}
STEP_S = 4.0
SLOW_RANK = 1234  # the rank whose mlp phase and one kernel are 2x (``slow_rank``)
# each window statistic of a phase or step over its median (argus_*_window_seconds{stat})
WINDOW_STATS = {"min": 0.98, "p25": 0.99, "median": 1.0, "p75": 1.01, "max": 1.03}


def slow_rank(ranks: int) -> int:
    """The slow rank of a ``ranks``-rank cluster: SLOW_RANK, or the middle rank of one
    smaller than that."""
    return SLOW_RANK if ranks > SLOW_RANK else ranks // 2


def topology_for(ranks: int) -> Topology:
    """All four axes used (the rules' worst case), dp scaled to the world size."""
    if ranks in TOPOLOGY:
        return TOPOLOGY[ranks]
    if ranks % 40:
        raise SystemExit("--ranks must be a multiple of 40 (tp=4, ep=2, pp=5, dp=N/40)")
    return Topology(tp=4, ep=2, pp=5, dp=ranks // 40)


def exporter_templates() -> list[tuple[str, str, dict, str]]:
    """(kind, name, extra labels, value key) of every series one rank's exporter exposes."""
    from argus_exporters.health import Health
    from argus_exporters.identity import RankIdentity
    from argus_exporters.metrics import StepMetrics

    identity = RankIdentity("bench", 0, 1, 0, "node-0", {a: 0 for a in AXES})
    metrics = StepMetrics(identity, Health(), 32)
    health = metrics.health
    health.probe_state("phases", "on")
    health.drop("queue_full", 0)
    metrics.observe(1.0, 0.9, dict.fromkeys(PHASES, 0.1))
    base = set(identity.labels())
    out = []
    for family in metrics.collect():
        for sample in family.samples:
            extra = {k: v for k, v in sample.labels.items() if k not in base}
            out.append((family.type, sample.name, extra, sample.name))
    return out


class SyntheticCluster:
    """Renders every rank's exporter series (and optionally kernel summaries) as text."""

    def __init__(self, ranks: int, targets: int, kernel_text: list[bytes]):
        self.topology = topology_for(ranks)
        coords = self.topology.coords()
        self.templates = exporter_templates()
        self.started = time.time()
        rng = np.random.default_rng(0)
        self.speed = np.exp(rng.normal(0, 0.01, ranks))
        self.slow_rank = slow_rank(ranks)
        self.groups = np.array_split(np.arange(ranks), targets)
        self.kernel_text = kernel_text
        self.prefixes = []
        for members in self.groups:
            ident = [",".join(['job="bench"', f'rank="{r}"', f'host="node-{r // 8}"',
                               *(f'{a}="{coords[r, i]}"' for i, a in enumerate(AXES))])
                     for r in members.tolist()]
            per_template = []
            for _kind, name, extra, _key in self.templates:
                tail = "".join(f',{k}="{v}"' for k, v in extra.items())
                per_template.append([f"{name}{{{labels}{tail}}} " for labels in ident])
            self.prefixes.append(per_template)

    def values(self, name: str, extra: dict, members: np.ndarray, now: float) -> np.ndarray:
        """Each member rank's value of one series at ``now``."""
        steps = np.floor((now - self.started) / STEP_S) + 100
        phase = extra.get("phase")
        slow = np.where(members == self.slow_rank, 2.0, 1.0) if phase == "mlp" else 1.0
        speed = self.speed[members]
        if phase is not None:
            seconds = PHASES[phase] * speed * slow
            if name == "argus_phase_seconds_total":
                return seconds * steps
            return seconds * WINDOW_STATS[extra["stat"]]
        step = sum(PHASES.values()) * 1.05
        table = {"argus_steps_total": np.full(len(members), steps),
                 "argus_step_seconds_total": step * steps * np.ones(len(members)),
                 "argus_step_gpu_seconds_total": sum(PHASES.values()) * steps * speed}
        if name in table:
            return table[name]
        if name == "argus_step_window_seconds":
            return step * WINDOW_STATS[extra["stat"]] * np.ones(len(members))
        if name == "argus_exporter_probe_up":
            return np.ones(len(members))
        return np.zeros(len(members))  # health counters and gauges of a quiet exporter

    def render(self, target: int) -> bytes:
        """The /metrics text of one target (a slice of the ranks)."""
        now = time.time()
        members = self.groups[target]
        lines = []
        typed = set()
        for (kind, name, extra, _), prefixes in zip(self.templates, self.prefixes[target],
                                                   strict=True):
            family = name.removesuffix("_total") if kind == "counter" else name
            if family not in typed:
                typed.add(family)
                lines.append(f"# TYPE {family} {kind}")
            values = self.values(name, extra, members, now).tolist()
            lines.extend(map("".join, zip(prefixes, map(repr, values), strict=True)))
        body = ("\n".join(lines) + "\n").encode()
        return body + (self.kernel_text[target] if target < len(self.kernel_text) else b"")


def scorer_exposition(ranks: int):
    """The scorer's /metrics for the bench job: its own ``judge`` and collector on the phase
    table it would read (L2 only: the kernel summaries are the scorer half's business),
    rendered at each scrape with a fresh last-success time (a scorer keeping up)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from argus_core.score.service import Published, ScoreConfig, Scorer
    from argus_core.simulate.summaries import synthetic_summaries

    coords = topology_for(ranks).coords()
    snapshot = JobSnapshot("bench", synthetic_summaries(0, 0), {}, phase_snapshot(ranks, coords))
    scorer = Scorer(ScoreConfig(prometheus="http://127.0.0.1:9090"))
    scorer.published = Published(judgements={"bench": judge(snapshot)})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(scorer)

    def render() -> bytes:
        scorer.published.last_success = time.time()
        return generate_latest(registry)

    return render


def serve(cluster: SyntheticCluster, scorer) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            target = self.path.strip("/").split("/")[-1]
            body = scorer() if target == "scorer" else cluster.render(int(target))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def kernel_exposition(ranks: int, kernels: int, targets: int) -> list[bytes]:
    """The processors' kernel-summary exposition, split like the exporter targets."""
    from prometheus_client import CollectorRegistry, generate_latest

    if kernels == 0:
        return []
    summary = synthetic_summaries(ranks, kernels, slow={slow_rank(ranks): 2.0})
    parts = []
    for members in np.array_split(np.arange(ranks), targets):
        part = summary.take(np.isin(summary.rank, members))

        class Collector:
            def collect(self, part=part):
                yield from summary_families({"bench": part})

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        parts.append(generate_latest(registry))
    return parts


def query(url: str, expr: str, timeout: float = 120, params: dict[str, str] | None = None,
          ) -> tuple[list[dict], float]:
    """An instant query's result and its wall time in seconds."""
    body = urllib.parse.urlencode({"query": expr, **(params or {})}).encode()
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=timeout) as r:
        data = orjson.loads(r.read())
    return data["data"]["result"], time.perf_counter() - t0


def group_intervals(rules: RulesConfig) -> dict[str, float]:
    """Rule group name -> its evaluation interval (seconds)."""
    from argus_core.rules.config import parse_duration

    return {g["name"]: parse_duration(g["interval"])
            for g in (*recording_groups(rules), *alert_groups(rules))}


def rule_durations(url: str) -> dict[str, float]:
    result, _ = query(url, "prometheus_rule_group_last_duration_seconds")
    return {r["metric"]["rule_group"].split(";")[-1]: float(r["value"][1]) for r in result}


def rule_times(url: str) -> dict[str, float]:
    """Each rule's last evaluation time (``/api/v1/rules``' ``evaluationTime``), by
    ``group/name{axis}``."""
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60) as answer:
        groups = json.load(answer)["data"]["groups"]
    timed = {}
    for group in groups:
        for rule in group["rules"]:
            axis = (rule.get("labels") or {}).get("axis")
            name = f"{group['name']}/{rule['name']}" + (f"{{{axis}}}" if axis else "")
            timed[name] = float(rule.get("evaluationTime", 0.0))
    return timed


def expression_times(url: str, groups: list[dict], rounds: int = 3) -> dict[str, float]:
    """Each rule's expression run as an instant query against the store, by
    ``group/name{axis}``: median seconds over ``rounds`` (the store's result cache bypassed
    with ``nocache=1``, which Prometheus ignores). What a rule costs the query engine on either
    engine alike, where vmalert reports no rule's own time; the write-back is not in it."""
    timed: dict[str, list[float]] = {}
    for _ in range(rounds):
        for group in groups:
            for rule in group["rules"]:
                axis = (rule.get("labels") or {}).get("axis")
                name = (f"{group['name']}/{rule.get('record') or rule['alert']}"
                        + (f"{{{axis}}}" if axis else ""))
                _, seconds = query(url, rule["expr"], params={"nocache": "1"})
                timed.setdefault(name, []).append(seconds)
    return {name: float(np.median(seconds)) for name, seconds in timed.items()}


def slowest_rules(samples: list[dict[str, float]], top: int = 12) -> list[str]:
    """The rules with the longest median evaluation time over the sampled rounds, as
    ``group/name{axis}: seconds``: where an optimisation pays. Taken while the rules are
    measured, not after (the scorer's fetch that follows loads Prometheus too)."""
    names = {name for sample in samples for name in sample}
    medians = {name: float(np.median([s[name] for s in samples if name in s]))
               for name in names}
    return [f"{name}: {seconds:.3f}"
            for name, seconds in sorted(medians.items(), key=lambda kv: -kv[1])[:top]]


def missed(url: str) -> float:
    result, _ = query(url, "sum(prometheus_rule_group_iterations_missed_total)")
    return float(result[0]["value"][1]) if result else 0.0


def api_answers(summary) -> tuple[bytes, bytes]:
    """Prometheus's instant-query answers (executions; both quantiles) for the summaries,
    written as Prometheus writes them (built as text: a dict per row would not fit)."""
    ts = f"{time.time():.3f}"
    names = [json.dumps(n) for n in summary.names]
    executions, durations = [], []
    rows = sorted(zip(summary.rank.tolist(), summary.kernel.tolist(), summary.stream.tolist(),
                      summary.cluster.tolist(), summary.count.tolist(),
                      summary.p50_ns.tolist(), summary.p99_ns.tolist(), strict=True),
                  key=lambda r: (str(r[3]), summary.names[r[1]], str(r[0]), str(r[2])))
    # Prometheus's order: labels by name, series by their label values in that order
    # (cluster, instance, job, kernel, [quantile,] rank, stream).
    for rank, kernel, stream, cluster, count, p50, p99 in rows:
        head = (f'"cluster":"{cluster}","instance":"node:9700","job":"bench",'
                f'"kernel":{names[kernel]}')
        tail = f'"rank":"{rank}","stream":"{stream}"'
        executions.append(f'{{"metric":{{"__name__":"argus_kernel_executions",{head},{tail}}},'
                          f'"value":[{ts},"{count}"]}}')
        for q, v in (("0.5", p50), ("0.99", p99)):
            durations.append(((str(cluster), summary.names[kernel], q, str(rank), str(stream)),
                              f'{{"metric":{{"__name__":"argus_kernel_duration_seconds",{head},'
                              f'"quantile":"{q}",{tail}}},"value":[{ts},"{v * 1e-9!r}"]}}'))
    durations = [text for _, text in sorted(durations)]

    def answer(rows: list[str]) -> bytes:
        return ('{"status":"success","data":{"resultType":"vector","result":['
                + ",".join(rows) + "]}}").encode()

    return answer(executions), answer(durations)


def scorer_compute(ranks: int, kernels: int) -> dict:
    """Parse and compute time of one scorer round at ``ranks`` x ``kernels``, fetched (as the
    scorer fetches) one peer set (pipeline stage) at a time."""
    summary = synthetic_summaries(ranks, kernels, slow={slow_rank(ranks): 2.0})
    one = scorer_shard(summary, ranks, 0, 1)
    judgement = one.pop("judgement")
    flagged = set(judgement.kernels.rank[judgement.kernels.straggler].tolist())
    return {**one, "scorer_slow_rank_found": flagged == {slow_rank(ranks)},
            "scorer_l2_tests": judgement.l2_tests,  # the L2 ran on every rank and phase
            "scorer_l2_findings": sorted({f"{f.rank}:{f.phase}:{f.axis}"
                                          for f in judgement.phases})}


def scorer_shards(ranks: int, kernels: int, shards: int) -> dict:
    """The same round split over ``shards`` scorers (``--split peer-set``), one after the
    other: each shard's round seconds, and whether together they publish what one does."""
    summary = synthetic_summaries(ranks, kernels, slow={slow_rank(ranks): 2.0})
    whole = scorer_shard(summary, ranks, 0, 1)
    parts = [scorer_shard(summary, ranks, i, shards) for i in range(shards)]

    def published(judgements) -> tuple:
        kernels = sorted((int(j.kernels.rank[i]), j.kernels.names[j.kernels.kernel[i]],
                          float(j.kernels.score[i]), bool(j.kernels.straggler[i]))
                         for j in judgements for i in range(len(j.kernels)))
        return (kernels, sorted(v for j in judgements for v in j.verdicts),
                sorted((f.rank, f.phase, f.axis, f.ratio) for j in judgements
                       for f in j.phases), sum(j.l2_tests for j in judgements))

    return {"scorer_shards": shards,
            "scorer_shard_round_seconds": [round(p["scorer_round_seconds"], 2) for p in parts],
            "scorer_shard_series": [p["scorer_series"] for p in parts],
            "scorer_shards_agree": published([whole["judgement"]])
            == published([p["judgement"] for p in parts])}


def scorer_shard(summary, ranks: int, shard: int, shards: int) -> dict:
    """One scorer's round on the summaries of its peer sets (all of them when ``shards`` is
    1; else those ``peer_set_shard`` gives it, and the stage sample's others), as Prometheus
    would answer them: decode, rebuild, judge, restrict."""
    from argus_core.gcpause import cycle_collection_paused
    from argus_core.score.core_adapter import restrict
    from argus_core.score.prometheus import read_columns
    from argus_core.score.service import peer_set_shard
    from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS, concat, stage_sample

    topology = topology_for(ranks)
    coords = topology.coords()
    stage = coords[:, AXES.index("pp")]
    phases = phase_snapshot(ranks, coords)
    owned = [p for p in range(topology.pp)
             if shards == 1 or peer_set_shard("bench", p, shards) == shard]
    wanted = [stage[summary.rank] == p for p in owned]
    if shards > 1:  # the stage sample's ranks outside this shard's peer sets
        sample = np.zeros(ranks, dtype=bool)
        sample[stage_sample(phases)] = True
        sample[np.isin(stage, owned)] = False
        wanted.append(sample[summary.rank])
    names: dict[str, int] = {}
    parts, parse_s, rebuild_s, series, fallbacks = [], 0.0, 0.0, 0, 0
    started, render_s = time.perf_counter(), 0.0
    for mask in wanted:
        t0 = time.perf_counter()
        answers = api_answers(summary.take(mask))
        render_s += time.perf_counter() - t0
        with cycle_collection_paused():  # as the scorer decodes (score/snapshot.py)
            t0 = time.perf_counter()
            (executions, e_json), (durations, d_json) = (
                read_columns("bench", answers[0], SUMMARY_INTS, ("kernel",)),
                read_columns("bench", answers[1], SUMMARY_INTS, SUMMARY_TEXTS))
            parse_s += time.perf_counter() - t0
        del answers
        fallbacks += e_json + d_json
        series += len(executions) + len(durations)
        t0 = time.perf_counter()
        parts.append(kernel_summary(executions, durations, 60_000_000_000, names))
        del executions, durations
        rebuild_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    own = parts[:len(owned)]
    table = concat(own, names, 60_000_000_000)
    snapshot = JobSnapshot("bench", table, {r: tuple(coords[r]) for r in range(ranks)}, phases,
                           dict.fromkeys(range(ranks), 1 / STEP_S))
    if shards > 1:
        snapshot.peer_sets = owned
        snapshot.stage_sample = concat(parts[len(owned):], names, 60_000_000_000)
    judgement = restrict(judge(snapshot, peer_axis="pp"), snapshot, "pp",
                         lead=shards == 1 or 0 in owned)
    judge_s = time.perf_counter() - t0
    round_s = time.perf_counter() - started - render_s  # decode, rebuild, freeing, judge
    return {"scorer_compute_seconds": rebuild_s + judge_s, "scorer_rebuild_seconds": rebuild_s,
            "scorer_judge_seconds": judge_s, "scorer_parse_seconds": parse_s,
            "scorer_round_seconds": round_s, "scorer_series": series,
            "scorer_decode_fallbacks": fallbacks, "judgement": judgement}


def phase_snapshot(ranks: int, coords: np.ndarray) -> PhaseTable:
    """The phase table the scorer's L2 judges (medians, shortest collective times, median
    step times; ranks 1% apart, the slow rank's mlp 2x), as ``phase_table`` builds it."""
    rng = np.random.default_rng(1)
    values = np.array(list(PHASES.values()))[None, :] * np.exp(rng.normal(0, 0.01, (ranks, 1)))
    values[slow_rank(ranks), list(PHASES).index("mlp")] *= 2.0
    wall = values.sum(axis=1).max() * 1.05 * np.ones(ranks)
    return PhaseTable(np.arange(ranks), list(PHASES), values, coords, wall,
                      [f"node-{r // 8}" for r in range(ranks)], values * 0.98)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--kernels", type=int, default=100,
                        help="kernels per rank for the scorer's compute (0: skip it)")
    parser.add_argument("--query-kernels", type=int, default=4)
    parser.add_argument("--shards", type=int, default=0,
                        help="also split the scorer's round over N peer-set shards")
    parser.add_argument("--scorer-only", action="store_true",
                        help="only the scorer's parse and compute (no Prometheus)")
    parser.add_argument("--l2-source", choices=L2_SOURCES, default=RulesConfig().l2_source,
                        help="the rules' L2 mode (default: the rules' default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop Prometheus on the way out
    if shutil.which("prometheus") is None and not args.scorer_only:
        sys.exit("prometheus is not installed (apt-get install prometheus)")

    result: dict = {"ranks": args.ranks, "phases": len(PHASES)}
    if args.kernels:
        result.update(scorer_compute(args.ranks, args.kernels))
        if args.shards > 1:
            result.update(scorer_shards(args.ranks, args.kernels, args.shards))
        result["kernels"] = args.kernels
    if args.scorer_only:
        report(result, args.json)
        return

    rules = dataclasses.replace(RulesConfig(), l2_source=args.l2_source)
    result["l2_source"] = rules.l2_source
    cluster = SyntheticCluster(args.ranks, args.targets,
                               kernel_exposition(args.ranks, args.query_kernels, args.targets))
    server, port = serve(cluster, scorer_exposition(args.ranks))
    workdir = Path(tempfile.mkdtemp(prefix="argus-rules-scale-"))
    (workdir / "rules.yml").write_text(to_yaml({"groups": recording_groups(rules)}))
    (workdir / "alerts.yml").write_text(to_yaml({"groups": alert_groups(rules)}))
    prom_port = free_port()
    url = f"http://127.0.0.1:{prom_port}"
    (workdir / "prometheus.yml").write_text(to_yaml({
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s",
                   "scrape_timeout": "14s"},
        "rule_files": [str(workdir / "rules.yml"), str(workdir / "alerts.yml")],
        # One scrape job per target (a slice of the ranks on its own path), and Prometheus
        # itself, whose metrics say how long each rule group took.
        "scrape_configs": [
            *({"job_name": f"argus-exporters-{t}", "honor_labels": True,
               "metrics_path": f"/t/{t}",
               "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
              for t in range(args.targets)),
            {"job_name": "argus-scorer", "honor_labels": True, "metrics_path": "/t/scorer",
             "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            {"job_name": "prometheus", "scrape_interval": "5s",
             "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}]}]}))
    prom = start_child(["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}"],
                       f"{url}/-/ready", workdir / "log")
    try:
        sums, amortized, per_rule, warm = [], [], [], 150.0
        intervals = group_intervals(rules)
        deadline = time.monotonic() + args.minutes * 60
        started = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(15)
            try:
                durations = rule_durations(url)
            except OSError:
                continue
            if time.monotonic() - started >= warm and durations:
                per_rule.append(rule_times(url))
                sums.append(sum(durations.values()))
                amortized.append(sum(d * 15.0 / intervals.get(g, 15.0)
                                     for g, d in durations.items()))
                last = durations
        count_s = sorted(query(url, 'count(argus_phase_window_seconds{stat="median"})')[1]
                         for _ in range(3))[1]
        series = query(url, "prometheus_tsdb_head_series")[0][0]["value"][1]
        from argus_core.score.prometheus import PrometheusAPI
        from argus_core.score.snapshot import fetch_job

        api = PrometheusAPI(url, timeout_s=300)
        t0 = time.perf_counter()
        snapshot = fetch_job(api, "bench", "", 60.0, "2m")
        query_s = time.perf_counter() - t0
        result.update({
            "rule_eval_seconds": max(sums) if sums else float("nan"),
            "rule_eval_seconds_median": float(np.median(sums)) if sums else float("nan"),
            "rule_eval_seconds_per_15s": max(amortized) if amortized else float("nan"),
            "rule_eval_seconds_samples": [round(x, 2) for x in sums],
            "evaluations_sampled": len(sums),
            "missed_iterations": missed(url),
            "groups": {g: round(d, 3) for g, d in sorted(last.items(), key=lambda kv: -kv[1])}
            if sums else {},
            "slowest_rules": slowest_rules(per_rule),
            "baseline_count_seconds": count_s,
            "ratio_to_count_baseline": (max(sums) / count_s) if sums else float("nan"),
            "head_series": int(series),
            "scorer_query_seconds": query_s,
            "scorer_fetched_series": api.series_fetched,
            "scorer_query_kernels": args.query_kernels,
            "scorer_query_ranks_with_summaries": len(np.unique(snapshot.summary.rank)),
        })
        alerts, _ = query(url, 'ALERTS{alertstate="firing"}')
        result["alerts_firing"] = sorted({f"{a['metric']['alertname']}:{a['metric'].get('rank')}"
                                          for a in alerts})
    finally:
        stop_child(prom, 60)
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    report(result, args.json)


if __name__ == "__main__":
    main()
