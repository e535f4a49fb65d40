"""Pipeline health: is Argus itself seeing everything (exporters, processors, scorer, scrapes).

A quiet fail-slow dashboard means nothing if records are being dropped. Exporter drops, queue
depth and CPU share, probe states; processor throughput, rejections, upload failures and
spool; scorer freshness; scrape health.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from argus_core.rules.config import format_duration
from argus_grafana import panels as p
from argus_grafana.queries import Queries, queries_for

UID = p.UIDS["pipeline"]
ANY_BAD = p.above((1e-9, "red"))


def build(q: Queries | None = None) -> dm.Dashboard:
    """The Pipeline health dashboard (uid ``argus-pipeline``). Its queries are ``q``
    (default: the default config's)."""
    q = q or queries_for()
    board = (p.new_dashboard(
        UID, "Argus / Pipeline health",
        "Argus's own health: exporters (drops, queues, CPU, probes), processors (throughput, "
        "rejections, uploads, spool, memory), the scoring job and the scrapes.",
        ["pipeline"], [p.datasource_variable(), p.job_variable(q, multi=True)])
        .with_panel(p.stat_panel(
            "Targets up", "Share of Argus scrape targets up, per scrape job (exporters, "
            "processors, scorers).", "percentunit", p.query(q.TARGETS_UP, "{{job}}",
                                                              instant=True),
            steps=((None, "red"), (0.99, "orange"), (1.0, "green")), w=8))
        .with_panel(p.stat_panel(
            "Trace files dropped (range)", "Perfetto files the processors dropped because "
            "their upload spool was full (trace store unreachable too long).", "short",
            p.query(q.PROCESSOR_DROPPED_FILES, "dropped", instant=True), steps=ANY_BAD, w=8))
        .with_panel(p.stat_panel(
            "Scorer: last good round", "Seconds since the scoring job last finished a round; "
            f"L2 and L3 verdicts are stale past {format_duration(q.SCORER_STALE_S)} "
            "(ArgusScorerStale).", "s",
            p.query(q.SCORER_AGE, "{{instance}}", instant=True),
            steps=p.above((q.SCORER_STALE_S * 0.4, "orange"), (q.SCORER_STALE_S, "red")),
            w=8))
        .with_panel(p.timeseries(
            "Exporter drops", "Records the exporters dropped, by reason (queue_full: the "
            "shipper could not keep up; sink_error: the endpoint failed). Any drop means "
            "missing evidence.", "cps", [p.query(q.EXPORTER_DROPS, "{{job}} {{reason}}")],
            w=8, steps=ANY_BAD, minimum=0))
        .with_panel(p.timeseries(
            "Exporter queue depth", "Deepest shipper queue per job; records drop at "
            f"ARGUS_QUEUE_RECORDS ({q.EXPORTER_QUEUE_RECORDS}).", "short",
            [p.query(q.EXPORTER_QUEUE_DEPTH, "{{job}}")], w=8, minimum=0,
            steps=p.above((q.EXPORTER_QUEUE_RECORDS / 2, "orange"),
                          (q.EXPORTER_QUEUE_RECORDS, "red"))))
        .with_panel(p.timeseries(
            "Exporter CPU share of step time", "CPU the exporters spend per second of training "
            f"step time; the promise is under {q.EXPORTER_CPU_BUDGET:.0%}.", "percentunit",
            [p.query(q.EXPORTER_CPU_SHARE, "{{job}}")], w=8, minimum=0,
            steps=p.above((q.EXPORTER_CPU_BUDGET, "red")), threshold_line=True))
        .with_panel(p.timeseries(
            "Exporter shipped bytes", "Uncompressed NDJSON the exporters delivered to their "
            "sink, per job.", "Bps", [p.query(q.EXPORTER_SHIPPED_BYTES, "{{job}}")], w=8,
            minimum=0))
        .with_panel(p.timeseries(
            "Exporter export failures", "Failed deliveries to the sink (Vector or the "
            "processor), per job.", "cps",
            [p.query(q.EXPORTER_EXPORT_FAILURES, "{{job}}")], w=8, steps=ANY_BAD, minimum=0))
        .with_panel(p.table(
            "Probe states", "Ranks per probe and state (on, off, unavailable) with the reason "
            "a probe is not running (e.g. CUPTI busy with another profiler).", "short",
            [p.query(q.PROBE_STATES, instant=True, table=True)], w=8,
            transformations=[p.transformation("organize", excludeByName={"Time": True},
                                              renameByName={"Value": "ranks"})]))
        .with_panel(p.timeseries(
            "Processor throughput", "Kernel events and records accepted per second, per "
            "processor.", "cps",
            [p.query(q.PROCESSOR_KERNEL_EVENTS, "{{instance}} kernel events", ref="A"),
             p.query(q.PROCESSOR_RECORDS, "{{instance}} records", ref="B")], w=8, minimum=0))
        .with_panel(p.timeseries(
            "Processor rejected records", "Records the processors refused, by reason (a field "
            "name: the exporter sent bad data; late: after its window closed; body: "
            "undecodable).", "cps", [p.query(q.PROCESSOR_REJECTED, "{{instance}} {{reason}}")],
            w=8, steps=ANY_BAD, minimum=0))
        .with_panel(p.timeseries(
            "Trace upload failures", "Failed uploads of Perfetto files to the trace store "
            "(they stay in the spool and are retried).", "cps",
            [p.query(q.PROCESSOR_UPLOAD_FAILURES, "{{instance}}")], w=8, steps=ANY_BAD,
            minimum=0))
        .with_panel(p.timeseries(
            "Processor spool and memory", "Bytes of Perfetto files waiting for upload, and the "
            "processor's resident memory.", "bytes",
            [p.query(q.PROCESSOR_SPOOL_BYTES, "{{instance}} spool", ref="A"),
             p.query(q.PROCESSOR_RSS, "{{instance}} RSS", ref="B")], w=8, minimum=0))
        .with_panel(p.timeseries(
            "Processor held kernel events", "Kernel events in memory not yet written to their "
            "window's file; at --max-buffered-events the processor answers 503.", "short",
            [p.query(q.PROCESSOR_HELD_EVENTS, "{{instance}}")], w=8, minimum=0))
        .with_panel(p.timeseries(
            "Scorer rounds", "Duration of the scoring job's rounds, and its failed Prometheus "
            "queries per second.", "s",
            [p.query(q.SCORER_ROUND_SECONDS, "{{instance}} round", ref="A"),
             p.query(q.SCORER_QUERY_FAILURES, "{{instance}} query failures/s", ref="B")],
            w=8, minimum=0))
        .with_panel(p.timeseries(
            "Scrape duration", "Longest scrape per Argus scrape job; near the scrape interval "
            "means targets are too big or too slow.", "s",
            [p.query(q.SCRAPE_SECONDS, "{{job}}")], w=24, h=6, minimum=0)))
    return p.assign_ids(board.build())
