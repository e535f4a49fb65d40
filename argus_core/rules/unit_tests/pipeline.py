"""promtool tests of the L3 alerts and of the pipeline's own alerts (components down, drops,
rejections, late records, upload failures)."""

from __future__ import annotations

import math

from argus_core.rules.config import LOOKBACK_S, RulesConfig
from argus_core.rules.unit_tests.base import (
    Series,
    alert_labels,
    annotations,
    check,
    expect,
    fires,
    intervals,
    matchers,
    rank_labels,
    rule_named,
    unit_test,
)


def l3_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """The scorer's flag, with its score in the description."""
    samples = intervals(config, config.for_kernel) + 2
    series = []
    for rank, score in ((4, 0.05), (5, 0.75)):
        labels = {**matchers(config.selectors.scorer), "job": "train", "rank": str(rank),
                  "kernel": "sm90_gemm", "stream": "7"}
        series.append(Series("argus_kernel_w1_score", labels, [score] * samples))
        series.append(Series("argus_kernel_straggler", labels,
                             [1.0 if rank == 5 else 0.0] * samples))
    rule = rule_named(groups, "ArgusKernelStraggler")
    expected = expect(
        alert_labels(config, rule, **matchers(config.selectors.scorer), job="train", rank="5",
                      kernel="sm90_gemm", stream="7"),
        annotations(rule, **{"$labels.kernel": "sm90_gemm", "$labels.stream": "7",
                              "$labels.rank": "5", "$labels.job": "train",
                              "$value | humanizePercentage": "75%"}))
    tests = [unit_test(config, "ArgusKernelStraggler: flagged kernels only", series,
                       alerts=fires(config, "ArgusKernelStraggler", 0, config.for_kernel,
                                    [expected]))]
    return [*tests, _suspect_test(config, groups)]


def _suspect_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A leaf switch its 16 slow ranks share pages; one rank's own GPU does not (the rank's
    own alerts already say it)."""
    samples = intervals(config, config.for_kernel) + 2
    scorer = matchers(config.selectors.scorer)
    series = []
    for kind, unit, cause, ranks, shared in (
            ("leaf", "leaf-1", "communication", 16, "true"),
            ("gpu", "node-0/gpu5", "compute", 1, "false")):
        key = {**scorer, "job": "train", "unit_kind": kind, "unit": unit, "cause": cause}
        series.append(Series("argus_suspect", key, [float(ranks)] * samples))
        series.append(Series("argus_suspect_info", {**key, "shared": shared, "ranks": "48-63",
                                                    "hosts": "node-6, node-7",
                                                    "healthy_under": "0"}, [1.0] * samples))
    rule = rule_named(groups, "ArgusSuspectUnit")
    expected = expect(
        alert_labels(config, rule, **scorer, job="train", unit_kind="leaf", unit="leaf-1",
                      cause="communication", hosts="node-6, node-7"),
        annotations(rule, **{"$value": "16", "$labels.job": "train",
                              "$labels.hosts": "node-6, node-7",
                              "$labels.cause": "communication", "$labels.unit_kind": "leaf",
                              "$labels.unit": "leaf-1"}))
    return unit_test(config, "ArgusSuspectUnit: a shared unit pages, one rank's GPU does not",
                     series, alerts=fires(config, "ArgusSuspectUnit", 0, config.for_kernel,
                                          [expected]))


def down_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """ArgusExporterDown and ArgusProcessorDown in both modes: Prometheus scraping the
    targets (``up`` goes to 0 and their series get staleness markers: one alert per target,
    not one more per rank) and Vector remote-writing them (no ``up``; the series just stop:
    an alert per silent rank of a job that still runs, per silent processor)."""
    sel = config.selectors
    tests = []
    down_at = 2
    lookback = math.ceil(LOOKBACK_S / config.evaluation_interval)
    for mode in ("scrape", "remote write"):
        scraped = mode == "scrape"
        stop = (lambda n: ["stale"] * n) if scraped else (lambda n: [None] * n)
        # Exporters: ranks 0-2 of job "train" on node-0 (rank 2 stops) and node-1.
        onset = down_at if scraped else down_at + lookback
        for_s = config.for_exporter_down
        samples = onset + intervals(config, for_s) + 2
        rule = rule_named(groups, "ArgusExporterDown")
        series, expected = [], []
        for rank in range(3):
            instance = f"node-{rank // 2}:9400"
            labels = {**rank_labels(config, "train", rank, host=f"node-{rank // 2}"),
                      "instance": instance}
            running = [100.0 + k for k in range(samples)]
            values = running[:down_at] + stop(samples - down_at) if rank == 2 else running
            series.append(Series("argus_steps_total", labels, values))
        if scraped:
            up = {**matchers(sel.exporters_up), "instance": "node-1:9400"}
            series += [Series("up", up, [1.0] * down_at + [0.0] * (samples - down_at)),
                       Series("up", {**up, "instance": "node-0:9400"}, [1.0] * samples)]
            expected.append(expect(alert_labels(config, rule, **up), annotations(
                rule, **{"$labels.instance": "node-1:9400"})))
        else:
            silent = {k: v for k, v in rank_labels(config, "train", 2, host="node-1").items()
                      if k in ("job", "rank", "host")}
            expected.append(expect(alert_labels(config, rule, **silent,
                                                  instance="node-1:9400"),
                                    annotations(rule, **{"$labels.rank": "2",
                                                          "$labels.host": "node-1",
                                                          "$labels.job": "train"})))
        tests.append(unit_test(config, f"ArgusExporterDown ({mode}): one rank's exporter stops",
                           series, alerts=fires(config, "ArgusExporterDown", onset, for_s,
                                                 expected)))
        if not scraped:  # a rank silent for longer than `silent_window` is forgotten
            fired = onset + intervals(config, for_s) + 1
            forgotten = down_at + math.ceil(config.silent_window / config.evaluation_interval)
            total = forgotten + 2
            series = [Series(s.name, s.labels, s.values[:down_at] + stop(total - down_at)
                             if rank == 2 else [100.0 + k for k in range(total)])
                      for rank, s in enumerate(series)]  # the three ranks above
            tests.append(unit_test(
                config, "ArgusExporterDown (remote write): forgotten after silent_window",
                series, alerts=[check(config, fired, "ArgusExporterDown", expected),
                                check(config, total - 1, "ArgusExporterDown", [])]))
        # A finished job (every rank stops) is not an exporter failure.
        series = [Series("argus_steps_total", rank_labels(config, "done", rank),
                         [100.0, 101.0, *stop(samples - 2)]) for rank in range(2)]
        tests.append(unit_test(config, f"ArgusExporterDown ({mode}): a finished job is not down",
                           series, alerts=[check(config, samples - 1, "ArgusExporterDown",
                                                  [])]))

        for_s = config.for_component_down
        samples = onset + intervals(config, for_s) + 2
        rule = rule_named(groups, "ArgusProcessorDown")
        series = []
        for node in range(2):
            labels = {**matchers(sel.processor), "instance": f"node-{node}:9700"}
            running = [10.0 * k for k in range(samples)]
            values = running[:down_at] + stop(samples - down_at) if node == 1 else running
            series.append(Series("argus_processor_records_total", labels, values))
            if scraped:
                up = {**matchers(sel.processor_up), "instance": f"node-{node}:9700"}
                series.append(Series("up", up, [1.0] * samples if node == 0 else
                                     [1.0] * down_at + [0.0] * (samples - down_at)))
        labels = ({**matchers(sel.processor_up), "instance": "node-1:9700"} if scraped
                  else {"instance": "node-1:9700"})
        tests.append(unit_test(config, f"ArgusProcessorDown ({mode}): a processor stops", series,
                           alerts=fires(config, "ArgusProcessorDown", onset, for_s, [expect(
                               alert_labels(config, rule, **labels),
                               annotations(rule, **{"$labels.instance": "node-1:9700"}))])))

    rule = rule_named(groups, "ArgusVectorScrapeFailing")
    start = 2
    window = round(max(config.rate_window, 4 * config.scrape_interval)
                   / config.evaluation_interval)
    samples = start + window + intervals(config, config.for_component_down) + 4
    errors = {**matchers(sel.vector_scrape), "host": "node-1", "error_type": "request_failed"}
    per = config.evaluation_interval
    tests.append(unit_test(config, "ArgusVectorScrapeFailing: Vector's scrapes fail", [
        Series("vector_component_errors_total", errors,
               [0.0] * start + [0.5 * per * (k + 1) for k in range(samples - start)]),
        Series("vector_component_errors_total", {**errors, "host": "node-0"}, [3.0] * samples)],
        alerts=fires(config, "ArgusVectorScrapeFailing", start, config.for_component_down,
                      [expect(alert_labels(config, rule, host="node-1"),
                               annotations(rule, **{"$labels.host": "node-1",
                                                     "$value | humanize": "500m"}))])))
    return tests


def pipeline_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """Exporter down or dropping, processor down, rejecting, dropping late records or failing
    uploads, scorer stale."""
    sel = config.selectors
    tests = []
    tests += down_tests(config, groups)
    # Counters that start moving at `start`: the rate windows see them one interval later.
    start = 2
    window_intervals = round(max(config.rate_window, 4 * config.scrape_interval)
                             / config.evaluation_interval)
    samples = start + window_intervals + intervals(config, config.for_pipeline) + 4
    per = config.evaluation_interval

    def counter(rate: float) -> list[float]:
        return [0.0] * start + [rate * per * (k + 1) for k in range(samples - start)]

    processor = {**matchers(sel.processor_up), **matchers(sel.processor),
                 "instance": "node-0:9700"}
    series = [
        Series("argus_exporter_dropped_records_total",
               {**rank_labels(config, "train", 0), "reason": "queue_full"}, counter(2.0)),
        Series("argus_processor_records_total", processor, counter(98.0)),
        Series("argus_processor_rejected_records_total", {**processor, "reason": "field"},
               counter(2.0)),
        Series("argus_processor_upload_failures_total", processor, counter(0.5)),
        # Late drops: 2% of the kernel events and of the records (steps) fire, 0.5% (stacks)
        # stays under processor_late_ratio.
        Series("argus_processor_kernel_events_total", processor, counter(100.0)),
        Series("argus_processor_late_total", {**processor, "kind": "kernels"}, counter(2.0)),
        Series("argus_processor_late_total", {**processor, "kind": "steps"}, counter(1.96)),
        Series("argus_processor_late_total", {**processor, "kind": "stacks"}, counter(0.49)),
    ]
    expected = {
        "ArgusExporterDroppingRecords": ({"job": "train", "reason": "queue_full"},
                                         {"$labels.job": "train", "$labels.reason": "queue_full",
                                          "$value | humanize": "2"}),
        "ArgusProcessorRejectingRecords": ({"instance": "node-0:9700"},
                                           {"$labels.instance": "node-0:9700",
                                            "$value | humanizePercentage": "2%"}),
        "ArgusProcessorUploadFailing": ({"instance": "node-0:9700"},
                                        {"$labels.instance": "node-0:9700",
                                         "$value | humanize": "500m"}),
    }
    alerts = []
    for name, (labels, values) in expected.items():
        rule = rule_named(groups, name)
        alerts += fires(config, name, start, config.for_pipeline, [
            expect(alert_labels(config, rule, **labels), annotations(rule, **values))])
    rule = rule_named(groups, "ArgusProcessorDroppingLate")
    alerts += fires(config, "ArgusProcessorDroppingLate", start, config.for_pipeline, [
        expect(alert_labels(config, rule, instance="node-0:9700", kind=kind),
                annotations(rule, **{"$labels.instance": "node-0:9700", "$labels.kind": kind,
                                      "$value | humanizePercentage": "2%"}))
        for kind in ("kernels", "steps")])
    tests.append(unit_test(config, "Pipeline: drops, rejections, late drops and upload failures",
                       series, alerts=alerts))

    rule = rule_named(groups, "ArgusScorerStale")
    last = 4
    stale = round(config.scorer_stale_after / config.evaluation_interval)
    samples = last + stale + intervals(config, config.for_component_down) + 3
    scorer = {**matchers(sel.scorer_up), **matchers(sel.scorer), "instance": "node-0:9800"}
    success = [k * per for k in range(last + 1)] + [last * per] * (samples - last - 1)
    # Fresh until `last`, then the age passes scorer_stale_after one interval after
    # last + stale (strictly greater).
    tests.append(unit_test(config, "ArgusScorerStale: no good round for too long", [
        Series("argus_scorer_last_success_timestamp_seconds", scorer, success),
        Series("up", scorer, [1.0] * samples)],
        alerts=fires(config, "ArgusScorerStale", last + stale + 1, config.for_component_down,
                      [expect(alert_labels(config, rule, instance="node-0:9800"),
                               annotations(rule, **{"$labels.instance": "node-0:9800"}))])))
    return tests
