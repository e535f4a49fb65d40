"""Kernel summaries over windows and their Prometheus exposition."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from argus_core.summaries import exposition, summarize_kernels
from argus_core.trace import KernelTable


def table(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    rank = rng.integers(0, 3, n)
    name = rng.integers(0, 2, n).astype(np.int32)
    start = rng.integers(0, 120_000_000_000, n)  # two 60 s windows
    dur = np.where(rng.random(n) < 0.5, 1e4, 1e5) * np.exp(rng.normal(0, 0.05, n))
    return KernelTable(rank, name, np.full(n, 7), start, dur.astype(np.int64),
                       ["gemm", "ncclDevKernel_AllGather"])


def test_windows_and_groups():
    """Each (rank, kernel, stream, window) is compressed on its own; counts add up per window."""
    t = table()
    s = summarize_kernels(t, window_s=60)
    assert set(s.window.tolist()) == {0, 1}
    assert s.count.sum() == len(t)
    for r in range(3):
        for w in (0, 1):
            events = ((t.rank == r) & (t.start_ns // 60_000_000_000 == w)).sum()
            assert s.count[(s.rank == r) & (s.window == w)].sum() == events
    assert set(s.cluster.tolist()) == {0, 1}  # the two modes stay apart


def test_window_must_be_positive():
    """A zero window is refused with the parameter's name."""
    with pytest.raises(ValueError, match="window_s"):
        summarize_kernels(table(), window_s=0)


def test_exposition_is_valid_prometheus_text():
    """The exposition parses, carries count/p50/p99 per cluster, and values are in seconds."""
    s = summarize_kernels(table(), window_s=600)
    text = exposition(s, job="llm").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    quantiles = families["argus_kernel_duration_seconds"].samples
    counts = families["argus_kernel_executions"].samples
    assert len(counts) == len(s) and len(quantiles) == 2 * len(s)
    first = next(q for q in quantiles if q.labels["quantile"] == "0.5"
                 and q.labels["rank"] == str(s.rank[0]) and q.labels["cluster"] == "0"
                 and q.labels["kernel"] == s.names[s.kernel[0]])
    assert first.value == pytest.approx(s.p50_ns[0] * 1e-9)
    assert {q.labels["job"] for q in quantiles} == {"llm"}


def test_top_kernels_bounds_series_per_rank():
    """Only each rank's k kernels with the most total time are kept (all their clusters)."""
    from argus_core.simulate.summaries import synthetic_summaries
    from argus_core.summaries import top_kernels

    s = synthetic_summaries(3, n_kernels=10)
    kept = top_kernels(s, 4)
    for rank in range(3):
        mine = kept.rank == rank
        assert len(set(kept.kernel[mine].tolist())) == 4
        total = {k: s.sum_ns[(s.rank == rank) & (s.kernel == k)].sum() for k in range(10)}
        best = sorted(total, key=total.get, reverse=True)[:4]
        assert set(kept.kernel[mine].tolist()) == set(best)
    assert len(top_kernels(s, 100)) == len(s)


@pytest.mark.parametrize("k", [1, 4, 10])
def test_the_kernels_beyond_the_top_k_are_summed_per_rank(k):
    """What the top-k cap leaves out of each rank is exported as two series per rank, its
    kernel time and its number of kernels: the cap's cost in L3 coverage is visible."""
    from prometheus_client.parser import text_string_to_metric_families

    from argus_core.simulate.summaries import synthetic_summaries
    from argus_core.summaries import kernel_tail, tail_headers, tail_lines, top_kernels

    s = synthetic_summaries(3, n_kernels=10)
    top = top_kernels(s, k)
    tails = kernel_tail(s, top)
    for rank in range(3):
        left = (s.rank == rank) & ~np.isin(s.kernel, top.kernel[top.rank == rank])
        assert tails[rank][0] == pytest.approx(s.sum_ns[left].sum() * 1e-9)
        assert tails[rank][1] == len({(int(a), int(b)) for a, b in
                                      zip(s.kernel[left], s.stream[left], strict=True)})
    assert (tails[0][1] == 0) == (k >= 10)
    seconds, kernels = tail_lines('job "x"', tails)
    headers = tail_headers()
    families = {f.name: f for f in text_string_to_metric_families(
        headers[0] + seconds + headers[1] + kernels)}
    assert {(x.labels["job"], x.labels["rank"]): x.value
            for x in families["argus_kernel_tail_seconds"].samples} == {
        ('job "x"', str(r)): pytest.approx(tails[r][0]) for r in range(3)}
    assert len(families["argus_kernel_tail_kernels"].samples) == 3


def test_pre_rendered_lines_are_what_prometheus_client_renders():
    """The processor's /metrics joins lines rendered once per window: they must be exactly
    prometheus-client's exposition of the same summaries, escapes and number formats
    included (names with quotes, backslashes and newlines; a zero; a huge count)."""
    from argus_core.summaries import KernelSummary, exposition, summary_headers, summary_lines

    summary = KernelSummary(
        rank=np.array([0, 1, 1, 7]), kernel=np.array([0, 1, 2, 0]),
        stream=np.array([7, 7, 13, 7]), window=np.zeros(4, dtype=np.int64),
        cluster=np.array([0, 1, 0, 2]), count=np.array([5, 0, 7, 10**12]),
        sum_ns=np.ones(4, dtype=np.int64), p50_ns=np.array([1234, 5, 10**9, 0]),
        p99_ns=np.array([99_999, 7, 3 * 10**9, 1]),
        names=['a"b', "c\\d", "e\nf"], window_ns=60 * 10**9)
    quantiles, counts = summary_lines(summary, 'job "x"\\y')
    headers = summary_headers()
    fast = headers[0] + quantiles + headers[1] + counts
    assert fast == exposition(summary, job='job "x"\\y').decode()
