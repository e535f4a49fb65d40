"""KDE valley compression: modes, quantiles, edge cases, and group independence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argus_core.stats.compress import CompressionConfig, compress


def lognormal_modes(rng, medians, n_per_mode, spread=0.05):
    return np.concatenate([m * np.exp(rng.normal(0, spread, n_per_mode)) for m in medians])


@pytest.mark.parametrize("medians", [
    [5e4], [1e4, 8e4], [2e3, 2e4, 2e5], [1e3, 5e3, 3e4, 2e5], [3e6, 1.5e8],
])
def test_recovers_well_separated_modes(medians):
    """Each well-separated mode comes back as one cluster with its median and its count."""
    rng = np.random.default_rng(len(medians))
    dur = lognormal_modes(rng, medians, 2000).astype(np.int64)
    table = compress(np.zeros(len(dur), dtype=np.int64), dur)
    assert len(table) == len(medians)
    np.testing.assert_allclose(table.p50_ns, medians, rtol=0.02)
    assert table.count.tolist() == [2000] * len(medians)
    assert table.cluster.tolist() == list(range(len(medians)))


def test_quantiles_match_numpy_within_a_grid_step():
    """p50 and p99 of a cluster agree with np.percentile to within one grid step (log space)."""
    rng = np.random.default_rng(1)
    dur = rng.lognormal(np.log(2e5), 0.3, 20_000).astype(np.int64)
    table = compress(np.zeros(len(dur), dtype=np.int64), dur)
    assert len(table) == 1
    step = np.log(dur.max() / dur.min()) / 512 * 1.5
    for got, q in ((table.p50_ns[0], 50), (table.p99_ns[0], 99)):
        assert abs(np.log(got / np.percentile(dur, q))) <= step


def test_no_duration_ceiling():
    """A 250 ms collective and a 2 us kernel are summarised with the same relative accuracy."""
    rng = np.random.default_rng(2)
    slow = rng.lognormal(np.log(2.5e8), 0.05, 500)
    fast = rng.lognormal(np.log(2e3), 0.05, 500)
    group = np.r_[np.zeros(500), np.ones(500)].astype(np.int64)
    table = compress(group, np.r_[slow, fast].astype(np.int64))
    np.testing.assert_allclose(table.p50_ns, [np.median(slow), np.median(fast)], rtol=0.01)
    assert table.max_ns[0] == pytest.approx(slow.astype(np.int64).max(), rel=1e-9)


def test_identical_durations_give_one_exact_cluster():
    """Constant durations (a fixed-cost kernel) compress to one cluster with p50 = p99 = value."""
    table = compress(np.zeros(300, dtype=np.int64), np.full(300, 4321))
    assert len(table) == 1
    assert table.p50_ns[0] == pytest.approx(4321)
    assert table.p99_ns[0] == pytest.approx(4321)
    assert table.sum_ns[0] == 300 * 4321


def test_single_event_and_zero_durations():
    """One event, and zero-length events (clamped to 1 ns), are summarised, not dropped."""
    table = compress(np.array([0, 1, 1]), np.array([777, 0, 0]))
    assert table.group.tolist() == [0, 1]
    assert table.count.tolist() == [1, 2]
    assert table.p50_ns[0] == pytest.approx(777)
    assert table.p50_ns[1] == pytest.approx(1)


def test_small_side_is_not_split_off():
    """A handful of outliers below min_cluster_samples stays in its mode instead of a cluster."""
    rng = np.random.default_rng(3)
    dur = np.r_[rng.lognormal(np.log(1e5), 0.05, 1000), np.full(5, 1e7)].astype(np.int64)
    table = compress(np.zeros(len(dur), dtype=np.int64), dur)
    assert len(table) == 1 and table.count[0] == 1005


def test_groups_are_independent():
    """Compressing many groups at once gives exactly what compressing each alone gives."""
    rng = np.random.default_rng(4)
    groups = [lognormal_modes(rng, [rng.uniform(1e3, 1e7)] * 1 + [rng.uniform(1e3, 1e7)], 300)
              for _ in range(12)]
    gid = np.repeat(np.arange(12), [len(g) for g in groups])
    dur = np.concatenate(groups).astype(np.int64)
    perm = rng.permutation(len(dur))
    together = compress(gid[perm], dur[perm])
    for g, values in enumerate(groups):
        alone = compress(np.zeros(len(values), dtype=np.int64), values.astype(np.int64))
        rows = together.group == g
        np.testing.assert_array_equal(together.count[rows], alone.count)
        np.testing.assert_allclose(together.p50_ns[rows], alone.p50_ns, rtol=1e-9)
        np.testing.assert_allclose(together.p99_ns[rows], alone.p99_ns, rtol=1e-9)


def test_config_is_validated():
    """Nonsense settings are refused with the setting's name."""
    with pytest.raises(ValueError, match="grid_size"):
        CompressionConfig(grid_size=4)
    with pytest.raises(ValueError, match="max_valley_ratio"):
        CompressionConfig(max_valley_ratio=0)


def test_max_clusters_one_keeps_groups_whole():
    """max_clusters=1 turns clustering off: one summary per group."""
    rng = np.random.default_rng(5)
    dur = lognormal_modes(rng, [1e4, 1e6], 500).astype(np.int64)
    table = compress(np.zeros(len(dur), dtype=np.int64), dur, config=CompressionConfig(
        max_clusters=1))
    assert len(table) == 1 and table.count[0] == 1000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**10)), min_size=1, max_size=400))
def test_summary_invariants(rows):
    """For any input: counts add up, sums are exact, min <= p50 <= p99 <= max, modes ordered."""
    group = np.array([g for g, _ in rows], dtype=np.int64)
    dur = np.array([d for _, d in rows], dtype=np.int64)
    table = compress(group, dur)
    np.testing.assert_array_equal(np.bincount(table.group, table.count, minlength=6),
                                  np.bincount(group, minlength=6))
    np.testing.assert_allclose(np.bincount(table.group, table.sum_ns, minlength=6),
                               np.bincount(group, dur.astype(float), minlength=6), rtol=1e-9)
    tol = 1 + 1e-9
    assert np.all(table.min_ns <= table.p50_ns * tol)
    assert np.all(table.p50_ns <= table.p99_ns * tol)
    assert np.all(table.p99_ns <= table.max_ns * tol)
    for g in np.unique(table.group):
        p50 = table.p50_ns[table.group == g]
        assert np.all(np.diff(p50) > 0)
