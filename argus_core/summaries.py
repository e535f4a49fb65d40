"""Kernel summaries: the compressed form of kernel executions, per rank, kernel, stream, window.

``summarize_kernels`` runs the valley compression over a whole ``KernelTable`` at once and
returns one row per cluster. ``exposition`` renders summaries as the Prometheus text format
that the processor serves: the triple (count, p50, p99) per cluster, which is all the L3
scoring needs to rebuild each rank's distribution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from argus_core.stats.compress import CompressionConfig, compress_sketch
from argus_core.stats.grouping import dense_ids
from argus_core.stats.sketch import BatchSketch, DurationSketch
from argus_core.trace import KernelTable

DEFAULT_WINDOW_S = 60.0


@dataclass
class KernelSummary:
    """One row per cluster of one (rank, kernel, stream, window); ``kernel`` indexes ``names``."""

    rank: np.ndarray
    kernel: np.ndarray
    stream: np.ndarray
    window: np.ndarray  # window index: start_ns // window_ns
    cluster: np.ndarray
    count: np.ndarray
    sum_ns: np.ndarray
    p50_ns: np.ndarray
    p99_ns: np.ndarray
    names: list[str]
    window_ns: int

    def __len__(self) -> int:
        return len(self.rank)

    def take(self, mask: np.ndarray) -> KernelSummary:
        """Rows selected by a boolean mask or an index array."""
        cols = {f: getattr(self, f)[mask] for f in
                ("rank", "kernel", "stream", "window", "cluster", "count", "sum_ns", "p50_ns",
                 "p99_ns")}
        return KernelSummary(**cols, names=self.names, window_ns=self.window_ns)


def summarize_kernels(kernels: KernelTable, window_s: float = DEFAULT_WINDOW_S,
                      config: CompressionConfig | None = None) -> KernelSummary:
    """Compress every (rank, kernel, stream, window) group of a kernel table in one pass."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    window_ns = int(window_s * 1e9)
    window = kernels.start_ns // window_ns
    ids, (rank, kernel, stream, win) = dense_ids(kernels.rank, kernels.name.astype(np.int64),
                                                  kernels.stream, window)
    return summarize_sketch(BatchSketch.of(ids, kernels.dur_ns, len(rank)), rank, kernel,
                            stream, win, kernels.names, window_ns, config)


def summarize_sketch(sketch: DurationSketch | BatchSketch, rank: np.ndarray, kernel: np.ndarray,
                     stream: np.ndarray, window: np.ndarray, names: list[str], window_ns: int,
                     config: CompressionConfig | None = None) -> KernelSummary:
    """Compress a duration sketch whose group g is (rank[g], kernel[g], stream[g], window[g]).

    The processor builds the sketch batch by batch as a window's kernels arrive; offline
    summaries build it from a whole table at once. Both end here.
    """
    clusters = compress_sketch(sketch, config)
    g = clusters.group
    return KernelSummary(rank=rank[g], kernel=kernel[g], stream=stream[g], window=window[g],
                         cluster=clusters.cluster, count=clusters.count, sum_ns=clusters.sum_ns,
                         p50_ns=clusters.p50_ns, p99_ns=clusters.p99_ns, names=names,
                         window_ns=window_ns)


def top_kernels(summary: KernelSummary, k: int) -> KernelSummary:
    """Clusters of each rank's ``k`` kernels (kernel x stream) with the most total time.

    Bounds the series a rank exposes, whatever its kernel zoo; the long tail stays in the
    Perfetto files.
    """
    if len(summary) == 0:
        return summary
    from argus_core.stats.grouping import dense_ids

    gid, (g_rank, _, _) = dense_ids(summary.rank, summary.kernel, summary.stream)
    total = np.bincount(gid, summary.sum_ns)
    order = np.lexsort((-total, g_rank))  # per rank, largest total first
    rank_sorted = g_rank[order]
    starts = np.searchsorted(rank_sorted, rank_sorted, side="left")
    keep_group = np.zeros(len(total), dtype=bool)
    keep_group[order[np.arange(len(order)) - starts < k]] = True
    return summary.take(keep_group[gid])


def kernel_tail(summary: KernelSummary, top: KernelSummary) -> dict[int, tuple[float, int]]:
    """Per rank of ``summary``: the kernel time (seconds) and the number of kernels (kernel x
    stream) that ``top`` (its ``top_kernels``) leaves out; every rank, zeros included."""
    from argus_core.stats.grouping import dense_ids

    out = {}
    for part, sign in ((summary, 1), (top, -1)):
        if not len(part):
            continue
        _, (g_rank, _, _) = dense_ids(part.rank, part.kernel, part.stream)
        units = np.bincount(g_rank, minlength=int(part.rank.max()) + 1)
        seconds = np.bincount(part.rank, part.sum_ns) * 1e-9
        for rank in np.unique(part.rank).tolist():
            was = out.get(rank, (0.0, 0))
            out[rank] = (was[0] + sign * float(seconds[rank]), was[1] + sign * int(units[rank]))
    return {rank: (max(s, 0.0), u) for rank, (s, u) in out.items()}


QUANTILE_FAMILY = "argus_kernel_duration_seconds"
EXECUTIONS_FAMILY = "argus_kernel_executions"
_QUANTILE_DOC = "Kernel duration quantile per cluster in the last window."
_EXECUTIONS_DOC = "Kernel executions per cluster in the last window."
TAIL_SECONDS_FAMILY = "argus_kernel_tail_seconds"
TAIL_KERNELS_FAMILY = "argus_kernel_tail_kernels"
_TAIL_SECONDS_DOC = ("Kernel time in the last window of the rank's kernels beyond the top-k "
                     "the processor exports (--top-k): what L3 does not see.")
_TAIL_KERNELS_DOC = "Kernels (kernel x stream) of the rank beyond the exported top-k."


def summary_families(by_job: Mapping[str, KernelSummary]) -> list:
    """Prometheus metric families for kernel summaries: per cluster, executions and the
    p50/p99 duration in seconds.

    One family per metric name whatever the number of jobs (a repeated ``# HELP`` makes
    Prometheus reject the whole scrape). Host and coords are deliberately not repeated on
    every series: they join from ``argus_rank_info`` (the info-metric pattern)."""
    from prometheus_client.core import GaugeMetricFamily

    labels = ["job", "rank", "kernel", "stream", "cluster"]
    quantiles = GaugeMetricFamily(QUANTILE_FAMILY, _QUANTILE_DOC, labels=[*labels, "quantile"])
    counts = GaugeMetricFamily(EXECUTIONS_FAMILY, _EXECUTIONS_DOC, labels=labels)
    for job, summary in by_job.items():
        rows = zip(summary.rank.tolist(), summary.kernel.tolist(), summary.stream.tolist(),
                   summary.cluster.tolist(), summary.count.tolist(), summary.p50_ns.tolist(),
                   summary.p99_ns.tolist(), strict=True)
        for rank, kernel, stream, cluster, count, p50, p99 in rows:
            key = [job, str(rank), summary.names[kernel], str(stream), str(cluster)]
            counts.add_metric(key, count)
            quantiles.add_metric([*key, "0.5"], p50 * 1e-9)
            quantiles.add_metric([*key, "0.99"], p99 * 1e-9)
    return [quantiles, counts]


def summary_lines(summary: KernelSummary, job: str) -> tuple[str, str]:
    """The sample lines of one job's summaries exactly as :func:`summary_families` renders
    them through prometheus-client: (quantile lines, execution lines). The processor renders
    them once per window and joins them on every scrape, which keeps /metrics at 10,000
    ranks to a join of strings."""
    from prometheus_client.utils import floatToGoString

    job_l = _label_value(job)
    names = [_label_value(name) for name in summary.names]
    quantiles, counts = [], []
    rows = zip(summary.rank.tolist(), summary.kernel.tolist(), summary.stream.tolist(),
               summary.cluster.tolist(), summary.count.tolist(), summary.p50_ns.tolist(),
               summary.p99_ns.tolist(), strict=True)
    for rank, kernel, stream, cluster, count, p50, p99 in rows:
        head = f'cluster="{cluster}",job="{job_l}",kernel="{names[kernel]}"'
        tail = f'rank="{rank}",stream="{stream}"'
        counts.append(f"{EXECUTIONS_FAMILY}{{{head},{tail}}} {floatToGoString(count)}\n")
        quantiles.append(f'{QUANTILE_FAMILY}{{{head},quantile="0.5",{tail}}} '
                         f"{floatToGoString(p50 * 1e-9)}\n")
        quantiles.append(f'{QUANTILE_FAMILY}{{{head},quantile="0.99",{tail}}} '
                         f"{floatToGoString(p99 * 1e-9)}\n")
    return "".join(quantiles), "".join(counts)


def summary_headers() -> tuple[str, str]:
    """The ``# HELP``/``# TYPE`` lines of the two families of :func:`summary_lines`."""
    return tuple(f"# HELP {name} {doc}\n# TYPE {name} gauge\n" for name, doc in (
        (QUANTILE_FAMILY, _QUANTILE_DOC), (EXECUTIONS_FAMILY, _EXECUTIONS_DOC)))


def tail_lines(job: str, tails: Mapping[int, tuple[float, int]]) -> tuple[str, str]:
    """The sample lines of ``kernel_tail``'s result for one job: (seconds, kernels)."""
    from prometheus_client.utils import floatToGoString

    job_l = _label_value(job)
    seconds = [f'{TAIL_SECONDS_FAMILY}{{job="{job_l}",rank="{rank}"}} {floatToGoString(s)}\n'
               for rank, (s, _) in sorted(tails.items())]
    kernels = [f'{TAIL_KERNELS_FAMILY}{{job="{job_l}",rank="{rank}"}} {floatToGoString(k)}\n'
               for rank, (_, k) in sorted(tails.items())]
    return "".join(seconds), "".join(kernels)


def tail_headers() -> tuple[str, str]:
    """The ``# HELP``/``# TYPE`` lines of the two families of :func:`tail_lines`."""
    return tuple(f"# HELP {name} {doc}\n# TYPE {name} gauge\n" for name, doc in (
        (TAIL_SECONDS_FAMILY, _TAIL_SECONDS_DOC), (TAIL_KERNELS_FAMILY, _TAIL_KERNELS_DOC)))


def _label_value(value: str) -> str:
    """A label value escaped for the text format (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def exposition(summary: KernelSummary, job: str) -> bytes:
    """Prometheus text exposition of kernel summaries (what a scrape of the processor returns)."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Collector:
        def collect(self):
            yield from summary_families({job: summary})

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry)
