"""Duration sketches: batch by batch is the same as all at once, in memory that does not grow."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from argus_core.stats.compress import compress, compress_sketch
from argus_core.stats.sketch import BIN_WIDTH, DurationSketch


def assert_same_clusters(a, b):
    for field in ("group", "cluster", "count"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for field in ("sum_ns", "min_ns", "max_ns"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-9)
    # Each quantile lies within the fine bin of the sample it interpolates; a logarithm rounded
    # across a bin edge may put that sample one bin over: two estimates are within two bins.
    for field in ("p50_ns", "p99_ns"):
        assert np.all(np.abs(np.log(getattr(a, field) / getattr(b, field))) <= 2 * BIN_WIDTH)


@settings(max_examples=40, deadline=None)
@example(rows=[(0, 3332), (0, 3333)], cuts=[])  # float32 and float64 logs of 3332 bin apart
@example(rows=[(0, 0), (0, 3332), (0, 3339)], cuts=[])
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10**9)), min_size=1, max_size=300),
       st.lists(st.integers(0, 300), max_size=6))
def test_batch_by_batch_equals_all_at_once(rows, cuts):
    """However a window's kernels are cut into batches, the clusters come out the same."""
    group = np.array([g for g, _ in rows], dtype=np.int64)
    dur = np.array([d for _, d in rows], dtype=np.int64)
    sketch = DurationSketch()
    bounds = [0, *sorted(c for c in cuts if c < len(rows)), len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        sketch.add(group[lo:hi], dur[lo:hi])
    assert_same_clusters(compress_sketch(sketch), compress(group, dur))


def test_bimodal_groups_absorbed_in_batches_keep_their_modes():
    """Modes that only show up batch after batch (a slow phase later in the window) separate."""
    rng = np.random.default_rng(0)
    sketch = DurationSketch()
    for median in (2e4, 2e4, 2e4, 9e4, 9e4):  # the slow mode arrives late
        sketch.add(np.zeros(2000, dtype=np.int64), rng.lognormal(np.log(median), 0.05, 2000))
    table = compress_sketch(sketch)
    assert table.count.tolist() == [6000, 4000]
    np.testing.assert_allclose(table.p50_ns, [2e4, 9e4], rtol=0.01)


def test_memory_follows_the_spread_not_the_event_count():
    """A sketch holds about as much after a million events as after ten thousand."""
    rng = np.random.default_rng(1)
    sketch = DurationSketch()
    groups = rng.integers(0, 50, 10_000)
    sketch.add(groups, rng.lognormal(np.log(3e4), 0.3, 10_000))
    early = sketch.nbytes
    for _ in range(99):
        sketch.add(rng.integers(0, 50, 10_000), rng.lognormal(np.log(3e4), 0.3, 10_000))
    assert sketch.count.sum() == 1_000_000
    assert sketch.nbytes < 2 * early and sketch.nbytes < 2 << 20


def test_narrow_kernels_keep_their_quantiles_and_are_not_split():
    """A kernel with 0.1% jitter: one cluster, p50 and p99 within a fine bin of the truth."""
    rng = np.random.default_rng(2)
    dur = np.rint(rng.normal(1e6, 1e3, 200_000)).astype(np.int64)
    table = compress(np.zeros(len(dur), dtype=np.int64), dur)
    assert len(table) == 1
    for got, q in ((table.p50_ns[0], 50), (table.p99_ns[0], 99)):
        assert abs(np.log(got / np.percentile(dur, q))) <= BIN_WIDTH


def test_bad_batches_are_refused_by_name():
    sketch = DurationSketch()
    with pytest.raises(ValueError, match="differ in length"):
        sketch.add(np.zeros(3, dtype=np.int64), np.ones(2))
    with pytest.raises(ValueError, match="group ids"):
        sketch.add(np.array([-1]), np.ones(1))
    sketch.add(np.zeros(0, dtype=np.int64), np.zeros(0), n_groups=3)
    assert sketch.n_groups == 3 and len(compress_sketch(sketch)) == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=200))
def test_a_single_cluster_keeps_the_exact_extremes(durations):
    """Minimum and maximum are the measured ones, whatever bin a rounded logarithm picks."""
    dur = np.array(durations, dtype=np.int64)
    for table in (compress(np.zeros(len(dur), dtype=np.int64), dur),
                  compress_sketch(_sketch_of(dur))):
        assert table.min_ns[0] == dur.min() and table.max_ns[-1] == dur.max()


def test_an_empty_table_compresses_to_no_clusters():
    """No events, or groups declared and left empty: no rows, no error."""
    assert len(compress(np.zeros(0, dtype=np.int64), np.zeros(0))) == 0
    assert len(compress(np.zeros(0, dtype=np.int64), np.zeros(0), n_groups=3)) == 0
    assert len(compress_sketch(DurationSketch())) == 0


def _sketch_of(dur: np.ndarray) -> DurationSketch:
    sketch = DurationSketch()
    sketch.add(np.zeros(len(dur), dtype=np.int64), dur)
    return sketch
