"""The processor's /metrics: kernel summaries per rank, rank identities, the service's health.

A prometheus-client custom collector: fresh families on every scrape, one family per metric
name whatever the number of jobs. It reads the processor without its lock (copies of dicts are
atomic under the GIL), so a scrape never waits for the writer.
"""

from __future__ import annotations

from typing import Any

from argus_core.processor.core import Processor, concat_summaries
from argus_core.schema import PLACEMENT_KEYS
from argus_core.summaries import KernelSummary


class ProcessorCollector:
    """Collector for one processor, its connection guard and its log rate limit."""

    def __init__(self, processor: Processor, guard: Any = None, log_limit: Any = None, *,
                 summaries: bool = True):
        self.processor = processor
        self.guard = guard
        self.log_limit = log_limit
        self.summaries = summaries  # False: the caller adds Processor.summary_exposition()

    def collect(self):
        """Prometheus collector protocol."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from argus_core.summaries import summary_families

        p = self.processor
        if self.summaries:
            by_job: dict[str, list[KernelSummary]] = {}
            for (job, _), (_, summary) in sorted(list(p.latest.items()),
                                                 key=lambda item: item[0]):
                by_job.setdefault(job, []).append(summary)
            yield from summary_families({job: concat_summaries(summaries)
                                         for job, summaries in by_job.items()})
        info = GaugeMetricFamily("argus_rank_info", "Identity of each rank seen (value 1).",
                                 labels=["job", "rank", "host", "dp", "tp", "pp", "ep"])
        for ident in p.windows.identities():
            info.add_metric([ident.job, str(ident.rank), ident.host, *map(str, ident.coords)], 1)
        yield info
        placement = GaugeMetricFamily(
            "argus_rank_placement_info",
            "Where each rank runs: local rank and placement (value 1; empty label: unknown).",
            labels=["job", "rank", "host", "local_rank", *PLACEMENT_KEYS])
        for ident in p.windows.identities():
            placement.add_metric([ident.job, str(ident.rank), ident.host, str(ident.local_rank),
                                  *(str(ident.placement.get(k, "")) for k in PLACEMENT_KEYS)], 1)
        yield placement

        def counter(name, doc, value, labels=None):
            family = CounterMetricFamily(name, doc, labels=list(labels or {}))
            if labels is None:
                family.add_metric([], value)
            return family

        def gauge(name, doc, value):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        yield counter("argus_processor_records", "Valid records accepted.", p.stats.records_in)
        yield counter("argus_processor_kernel_events", "Kernel executions accepted.",
                      p.stats.kernel_events_in)
        yield counter("argus_processor_received_bytes", "Request body bytes received.",
                      p.stats.bytes_in)
        rejected = CounterMetricFamily("argus_processor_rejected_records",
                                       "Records refused, by reason (the field at fault, body).",
                                       labels=["reason"])
        for reason, n in sorted(p.stats.rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
        late = CounterMetricFamily("argus_processor_late",
                                   "Items dropped because their window had closed, by kind "
                                   "(kernels: kernel executions; steps, stacks: records).",
                                   labels=["kind"])
        for kind in ("kernels", "steps", "stacks"):
            late.add_metric([kind], p.windows.late[kind])
        yield late
        memory = GaugeMetricFamily("argus_processor_memory_bytes",
                                   "Estimated bytes held, by kind (what the budget counts).",
                                   labels=["kind"])
        for kind, value in sorted(p.memory().items()):
            memory.add_metric([kind], value)
        yield memory
        yield gauge("argus_processor_memory_budget_bytes",
                    "Memory budget: past it intake answers 503.", p.config.memory_budget_bytes)
        yield gauge("argus_processor_open_windows", "Windows buffering records.",
                    len(p.windows.open))
        yield counter("argus_processor_windows_closed_early",
                      "Windows closed before their time to keep a rank within "
                      "--max-windows-per-rank (their records are written, not lost).",
                      p.stats.closed_early)
        yield counter("argus_processor_folded_floors",
                      "Floors of forgotten ranks folded into one per job (or one for all) "
                      "beyond --max-ranks of them.", p.windows.floors.folded)
        yield gauge("argus_processor_metrics_left_out_ranks",
                    "Ranks whose kernel summaries the last scrape left out "
                    "(--max-metrics-series).", p.stats.metrics_left_out)
        yield gauge("argus_processor_tracked_ranks", "(job, rank) pairs remembered.",
                    len(p.windows.ranks))
        yield counter("argus_processor_forgotten_ranks",
                      "Ranks forgotten after --state-ttl without records (or beyond "
                      "--max-ranks).", p.windows.forgotten_ranks)
        yield gauge("argus_processor_buffered_kernel_events",
                    "Kernel events held in open windows, not yet handed to the writer.",
                    p.windows.buffered_events)
        yield gauge("argus_processor_pending_windows", "Closed windows waiting to be written.",
                    p.pending_windows)
        yield counter("argus_processor_windows_written", "Windows compressed and stored.",
                      p.stats.windows_written)
        yield counter("argus_processor_kernel_events_written",
                      "Kernel executions written into Perfetto windows.",
                      p.stats.kernel_events_written)
        yield counter("argus_processor_window_errors", "Windows that failed to be written.",
                      p.stats.write_errors)
        yield counter("argus_processor_skipped_records",
                      "Steps and stack samples left out of a window's file because they could "
                      "not be encoded (the rest of the window is written).",
                      p.stats.skipped_records)
        yield counter("argus_processor_reordered_kernels",
                      "Kernels that arrived after later ones of their stream had been written "
                      "(they go to a 'reordered' lane of the stream's track).",
                      p.stats.reordered_kernels)
        yield counter("argus_processor_salvaged_windows",
                      "Unfinished windows of a previous (crashed) run uploaded at start "
                      "(--durability memory only).", p.stats.salvaged_windows)
        yield counter("argus_processor_replayed_bodies",
                      "Request bodies replayed from the write-ahead log at start.",
                      p.stats.replayed_bodies)
        if p.wal is not None:
            yield gauge("argus_processor_wal_bytes", "Write-ahead log on disk.",
                        p.wal.bytes_on_disk)
        yield counter("argus_processor_wal_errors",
                      "Write-ahead log writes that failed (answered 503).", p.stats.wal_errors)
        stats = p.uploader.stats
        yield counter("argus_processor_upload_failures", "Failed upload attempts.",
                      stats.failures)
        yield counter("argus_processor_uploaded_files", "Perfetto files stored.",
                      stats.uploaded_files)
        yield counter("argus_processor_dropped_files", "Files dropped: the spool was full.",
                      stats.dropped_files)
        yield gauge("argus_processor_spool_bytes", "Bytes waiting in the upload spool.",
                    p.uploader.spool_bytes)
        yield gauge("argus_processor_store_up",
                    "1 when the trace store took files at the last check or upload.",
                    0 if p.store_problem else 1)
        if self.guard is not None:
            yield gauge("argus_processor_connections", "Client connections open.",
                        self.guard.open)
            yield counter("argus_processor_evicted_connections",
                          "Connections closed to make room for new ones (stalled or idle "
                          "the longest) or refused at the cap.",
                          self.guard.evicted + self.guard.refused)
        if self.log_limit is not None:
            yield counter("argus_processor_suppressed_log_messages",
                          "Log messages held back by the rate limit.", self.log_limit.suppressed)


def render_metrics(processor: Processor, registry: Any) -> bytes:
    """The whole /metrics body: the kernel summaries' pre-rendered lines (bounded by
    ``max_metrics_series``) and the registry's families (``summaries=False``)."""
    from prometheus_client import generate_latest

    text, processor.stats.metrics_left_out = processor.summary_exposition()
    return text.encode() + generate_latest(registry)
