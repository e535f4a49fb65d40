"""Benchmark: the Argus rules and the scorer at 10,000 ranks on either metrics engine, each
engine started as ``argus stack`` starts it (``argus_core.stack.engines``), Prometheus
measured in the same run as the baseline.

    python bench/scale.py --engine victoriametrics|prometheus [--ranks 10000] [--kernels 100]
                          [--query-kernels 4] [--minutes 5] [--shards 5] [--json]

Both engines scrape the same synthetic cluster (``rules_scale.SyntheticCluster``: every
rank's exporter series, taken from ``StepMetrics`` itself, 10 targets; ``--query-kernels``
kernels of summaries per rank as the processors serve them; the scorer's published series)
every 15 s and evaluate every generated rule group at its production interval: Prometheus
alone, or victoria-metrics with two vmagents splitting the targets and vmalert. After
``--warm-seconds`` (150: the rate windows filled), every 15 s for the rest of ``--minutes``:
each group's evaluation time from the engine's own metrics (Prometheus'
``prometheus_rule_group_last_duration_seconds``; vmalert's
``vmalert_iteration_duration_seconds`` sum and count, differenced), on Prometheus each rule's
(``/api/v1/rules``' ``evaluationTime``: ``slowest_rules``, medians over the samples; vmalert
1.79's field is not the rule's own time: it reads alike for every rule of a group, and larger
than the group's whole evaluation); on both engines each rule's expression run as an instant
query against the store after the sampling (``slowest_expressions``, medians of three,
``expression_seconds_total`` their sum: the query engine's part, without the write-back), the
engine's series, samples ingested per second and the
summed RSS of its processes. Then the scorer's real fetch of the job as the stack's scorer
reads it (the query API on Prometheus; on victoria-metrics the kernel summaries exported,
``--read export``) plus its judgement (``scorer_round_seconds``), and, engine-free, the decode
and compute of the full ``--kernels`` round alone and split over ``--shards`` peer-set shards
(``rules_scale.scorer_compute``, ``scorer_shards``).

``rule_eval_seconds_per_15s``: each group's evaluation time x 15 s / its interval, summed
(the target: at most 3 s); ``missed_iterations``: evaluations the engine skipped while
sampled (target 0; ``missed_iterations_with_start`` counts the start-up too, and
``missed_iterations_by_group`` names the groups, start-up included).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from _report import report
from prometheus_client.parser import text_string_to_metric_families
from rules_scale import (
    SyntheticCluster,
    expression_times,
    group_intervals,
    kernel_exposition,
    query,
    rule_times,
    scorer_compute,
    scorer_exposition,
    scorer_shards,
    serve,
    slowest_rules,
)

from argus_core.rules.alerts import alert_groups
from argus_core.rules.config import RulesConfig
from argus_core.rules.generate import to_yaml
from argus_core.rules.recording import recording_groups
from argus_core.stack import engines
from argus_core.stack.configs import prometheus_config
from argus_core.stack.processes import free_port, start, wait_ready
from argus_core.stack.stack import binary

WARM_S = 150.0  # the rules' longest rate window (2m) plus a scrape, before sampling
SAMPLE_S = 15.0


def scrape_config(port: int, targets: int, own: dict[str, list[str]]) -> dict:
    """One scrape job per synthetic target (a slice of the ranks on its own path), the
    scorer's series, and the engine's own components."""
    jobs = [{"job_name": f"argus-exporters-{t}", "honor_labels": True,
             "metrics_path": f"/t/{t}", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            for t in range(targets)]
    jobs.append({"job_name": "argus-scorer", "honor_labels": True, "metrics_path": "/t/scorer",
                 "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]})
    jobs += [{"job_name": job, "static_configs": [{"targets": addresses}]}
             for job, addresses in own.items()]
    return {"global": {"scrape_interval": "15s", "scrape_timeout": "14s"},
            "scrape_configs": jobs}


def metrics(address: str) -> dict[str, list]:
    """A component's own /metrics, by sample name: [(labels, value)]."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def rss_bytes(pids: list[int]) -> int:
    """Summed resident set size of the processes (/proc)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class Probe:
    """What one engine says about itself: series, samples ingested, rule groups' times."""

    def __init__(self, engine: str, addr: dict[str, str]):
        self.engine, self.addr = engine, addr
        self.last: dict = {}

    def sample(self) -> dict:
        """Series, ingested samples (counter), and each group's (duration sum, count) or last
        duration, missed evaluations."""
        if self.engine == engines.PROMETHEUS:
            m = metrics(self.addr["prometheus"])
            groups = {labels["rule_group"].split(";")[-1]: value for labels, value in
                      m.get("prometheus_rule_group_last_duration_seconds", [])}
            return {"series": sum(v for _, v in m.get("prometheus_tsdb_head_series", [])),
                    "ingested": sum(v for _, v in
                                    m.get("prometheus_tsdb_head_samples_appended_total", [])),
                    "last": groups,
                    "missed": sum(v for _, v in
                                  m.get("prometheus_rule_group_iterations_missed_total", [])),
                    "missed_by_group": {
                        labels["rule_group"].split(";")[-1]: value for labels, value in
                        m.get("prometheus_rule_group_iterations_missed_total", []) if value}}
        store, ruler = metrics(self.addr["victoria-metrics"]), metrics(self.addr["vmalert"])
        sums = {labels["group"]: value for labels, value in
                ruler.get("vmalert_iteration_duration_seconds_sum", [])}
        counts = {labels["group"]: value for labels, value in
                  ruler.get("vmalert_iteration_duration_seconds_count", [])}
        return {"series": sum(v for labels, v in store.get("vm_cache_entries", [])
                              if labels.get("type") == "storage/hour_metric_ids"),
                "ingested": sum(v for _, v in store.get("vm_rows_inserted_total", [])),
                "sums": sums, "counts": counts,
                "missed": sum(v for _, v in ruler.get("vmalert_iteration_missed_total", [])),
                "missed_by_group": {labels["group"]: value for labels, value in
                                    ruler.get("vmalert_iteration_missed_total", []) if value}}

    def durations(self, now: dict) -> dict[str, float]:
        """Each group's evaluation time in the last sampling interval (its mean over the
        evaluations in it, vmalert: groups that did not run are left out; its last one,
        Prometheus)."""
        if self.engine == engines.PROMETHEUS:
            return now["last"]
        before = self.last or {"sums": {}, "counts": {}}
        out = {}
        for group, total in now["sums"].items():
            runs = now["counts"].get(group, 0) - before["counts"].get(group, 0)
            if runs > 0:
                out[group] = (total - before["sums"].get(group, 0.0)) / runs
        return out


def run_engine(engine: str, args, cluster_port: int, rules: RulesConfig) -> dict:
    """Start one engine on the synthetic cluster, sample it for ``--minutes``, fetch the job
    as the scorer does, stop it."""
    from argus_core.score.core_adapter import judge
    from argus_core.score.prometheus import PrometheusAPI
    from argus_core.score.snapshot import fetch_job

    workdir = Path(tempfile.mkdtemp(prefix=f"argus-scale-{engine}-"))
    names = engines.components(engine)
    addr = {name: f"127.0.0.1:{free_port()}" for name in names}
    files = {"recording": workdir / "argus.rules.yml", "alerting": workdir / "argus.alerts.yml"}
    files["recording"].write_text(to_yaml({"groups": recording_groups(rules)}))
    files["alerting"].write_text(to_yaml({"groups": alert_groups(rules)}))
    scrape = scrape_config(cluster_port, args.targets, engines.own_scrape_targets(engine, addr))
    nowhere = f"127.0.0.1:{free_port()}"  # no Alertmanager: what fires is read from ALERTS
    if engine == engines.PROMETHEUS:
        scrape = prometheus_config(scrape, rules, [str(files["recording"]),
                                                   str(files["alerting"])], nowhere)
    files["scrape"] = workdir / "scrape.yml"
    files["scrape"].write_text(to_yaml(scrape))
    processes = []
    try:
        for component in engines.commands(engine, binary, rules, workdir, addr, files, nowhere):
            process = start(component.name, component.argv, workdir / "logs")
            processes.append(process)
            wait_ready(process, component.ready, timeout=120)
        url = f"http://{addr[names[0]]}"
        probe = Probe(engine, addr)
        intervals = group_intervals(rules)
        per_15s, sums, rss, series, rates = [], [], [], [], []
        per_rule: list[dict[str, float]] = []
        started = time.monotonic()
        deadline = started + args.minutes * 60
        last_groups: dict[str, float] = {}
        missed_warm = None  # evaluations skipped before sampling began (start-up)
        probe.last = probe.sample()
        previous_t = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(SAMPLE_S)
            now, t = probe.sample(), time.monotonic()
            rss.append(rss_bytes([p.pid for p in processes]))
            if time.monotonic() - started >= args.warm_seconds:
                if missed_warm is None:
                    missed_warm = now["missed"]
                last_groups.update(probe.durations(now))  # every group's latest, as Prometheus'
                if last_groups:
                    sums.append(sum(last_groups.values()))
                    per_15s.append(sum(d * 15.0 / intervals.get(g, 15.0)
                                       for g, d in last_groups.items()))
                if engine == engines.PROMETHEUS:
                    per_rule.append(rule_times(url))
                series.append(now["series"])
                rates.append((now["ingested"] - probe.last["ingested"]) / (t - previous_t))
            probe.last, previous_t = now, t
        final = probe.sample()
        missed_total = final["missed"]
        by_expression = expression_times(url, [*recording_groups(rules), *alert_groups(rules)])
        api = PrometheusAPI(url, timeout_s=300, max_answer_bytes=4 << 30)
        t0 = time.perf_counter()
        # as the stack's scorer reads on this engine (engines.scorer_flags)
        lookback = 2 * rules.scrape_interval if engine != engines.PROMETHEUS else None
        snapshot = fetch_job(api, "bench", "", 60.0, "2m", export_lookback_s=lookback)
        fetch_s = time.perf_counter() - t0
        judgement = judge(snapshot, peer_axis="pp")
        round_s = time.perf_counter() - t0
        flagged = sorted(f"{f.rank}:{f.phase}" for f in judgement.phases)
        firing, _ = query(url, 'ALERTS{alertstate="firing"}')
        return {
            "engine": engine,
            "series": int(max(series)) if series else 0,
            "ingest_samples_per_second": float(np.median(rates)) if rates else float("nan"),
            "engine_rss_bytes": int(max(rss)) if rss else 0,
            "rule_eval_seconds": max(sums) if sums else float("nan"),
            "rule_eval_seconds_median": float(np.median(sums)) if sums else float("nan"),
            "rule_eval_seconds_per_15s": max(per_15s) if per_15s else float("nan"),
            "rule_eval_seconds_per_15s_median": float(np.median(per_15s)) if per_15s
            else float("nan"),
            "rule_eval_seconds_by_group": {g: round(d, 3) for g, d in
                                           sorted(last_groups.items(), key=lambda kv: -kv[1])},
            "slowest_rules": slowest_rules(per_rule, top=8),
            "slowest_expressions": slowest_rules([by_expression], top=10),
            "expression_seconds_total": sum(by_expression.values()),
            "evaluations_sampled": len(sums),
            "missed_iterations": missed_total - (missed_warm or 0.0),
            "missed_iterations_with_start": missed_total,
            "missed_iterations_by_group": final["missed_by_group"],  # start-up included
            "scorer_read": "query" if lookback is None else "export",
            "scorer_fetch_seconds": fetch_s,
            "scorer_round_seconds": round_s,
            "scorer_fetched_series": api.series_fetched,
            "scorer_l2_findings": flagged,
            "alerts_firing": sorted({f"{a['metric']['alertname']}:{a['metric'].get('rank')}"
                                     for a in firing}),
        }
    finally:
        for process in reversed(processes):
            process.stop(60)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=engines.ENGINES, default=engines.VICTORIAMETRICS,
                        help="the engine measured; Prometheus always runs first as the "
                             "baseline (default victoriametrics)")
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=100,
                        help="kernels per rank of the scorer's engine-free round (0: skip)")
    parser.add_argument("--query-kernels", type=int, default=4,
                        help="kernels per rank the engines hold and the scorer fetches")
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=5.0, help="per engine")
    parser.add_argument("--shards", type=int, default=5)
    parser.add_argument("--warm-seconds", type=float, default=WARM_S,
                        help=f"before sampling (default {WARM_S:g}: the rate windows filled)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the engine on the way out
    for name in engines.programs(args.engine) + engines.programs(engines.PROMETHEUS):
        binary(name)
    rules = dataclasses.replace(RulesConfig())
    cluster = SyntheticCluster(args.ranks, args.targets,
                               kernel_exposition(args.ranks, args.query_kernels, args.targets))
    server, port = serve(cluster, scorer_exposition(args.ranks))
    result: dict = {"ranks": args.ranks, "query_kernels": args.query_kernels,
                    "l2_source": rules.l2_source}
    try:
        runs = [run_engine(engines.PROMETHEUS, args, port, rules)]
        if args.engine != engines.PROMETHEUS:
            runs.append(run_engine(args.engine, args, port, rules))
    finally:
        server.shutdown()
    result["baseline"] = runs[0]
    result.update({k: v for k, v in runs[-1].items()})
    result["rule_eval_ratio_to_prometheus"] = (runs[-1]["rule_eval_seconds_per_15s"]
                                               / runs[0]["rule_eval_seconds_per_15s"])
    if args.kernels:
        compute = scorer_compute(args.ranks, args.kernels)
        result["scorer_compute_round_seconds"] = compute["scorer_round_seconds"]
        result["scorer_compute_kernels"] = args.kernels
        if args.shards > 1:
            shards = scorer_shards(args.ranks, args.kernels, args.shards)
            result["scorer_shard_round_seconds"] = shards["scorer_shard_round_seconds"]
            result["scorer_shards_agree"] = shards["scorer_shards_agree"]
    report(result, args.json)


if __name__ == "__main__":
    main()
