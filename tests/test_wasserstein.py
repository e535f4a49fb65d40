"""W1 on grids, directional excess, the O(N log N) peer mean, and mixture reconstruction."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr
from scipy.stats import wasserstein_distance

from argus_core.stats.compress import compress
from argus_core.stats.mixture import fast_ndtr, lognormal_params, mixture_quantile
from argus_core.stats.wasserstein import (
    excess_w1,
    mean_from_cdf,
    mean_w1_to_peers,
    trapezoid_weights,
    w1,
)


def empirical_cdf(samples: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.sort(samples), t, side="right") / len(samples)


@pytest.mark.parametrize("shift", [0.0, 0.5, 3.0])
def test_grid_w1_matches_scipy_on_samples(shift):
    """W1 from CDFs on a fine grid equals scipy's wasserstein_distance on the same samples."""
    rng = np.random.default_rng(0)
    a = rng.gamma(4, 1, 3000)
    b = rng.gamma(4, 1.2, 2500) + shift
    t = np.linspace(0, max(a.max(), b.max()) + 1, 40_001)
    weights = trapezoid_weights(t)
    got = w1(empirical_cdf(a, t)[None, :], empirical_cdf(b, t), weights)[0]
    assert got == pytest.approx(wasserstein_distance(a, b), rel=2e-3)


def test_excess_is_directional():
    """A slower distribution's excess is its shift; a faster one has none; both add to W1."""
    rng = np.random.default_rng(1)
    base = rng.normal(10, 1, 20_000)
    t = np.linspace(0, 20, 20_001)
    weights = trapezoid_weights(t)
    ref = empirical_cdf(base, t)
    slower = empirical_cdf(base + 2, t)[None, :]
    faster = empirical_cdf(base - 2, t)[None, :]
    assert excess_w1(slower, ref, weights)[0] == pytest.approx(2, rel=1e-3)
    assert excess_w1(faster, ref, weights)[0] == pytest.approx(0, abs=1e-9)
    both = excess_w1(slower, ref, weights) + excess_w1(ref[None, :], slower[0], weights)
    assert both[0] == pytest.approx(w1(slower, ref, weights)[0], rel=1e-9)


def test_mean_from_cdf():
    """The mean recovered from a CDF on a grid matches the sample mean."""
    rng = np.random.default_rng(2)
    x = rng.lognormal(3, 0.4, 50_000)
    t = np.linspace(x.min(), x.max(), 50_001)
    assert mean_from_cdf(empirical_cdf(x, t), t, trapezoid_weights(t)) == pytest.approx(
        x.mean(), rel=1e-3)


@pytest.mark.parametrize("n", [2, 3, 8, 33])
def test_mean_w1_to_peers_equals_all_pairs(n):
    """The sorted-prefix-sum peer mean equals the brute-force mean over all pairs."""
    rng = np.random.default_rng(n)
    samples = [rng.lognormal(rng.normal(0, 0.2), 0.3, 400) for _ in range(n)]
    t = np.linspace(0, 8, 4001)
    cdf = np.stack([empirical_cdf(s, t) for s in samples])
    weights = trapezoid_weights(t)
    fast = mean_w1_to_peers(cdf, weights)
    brute = [np.mean([w1(cdf[i][None], cdf[j], weights)[0] for j in range(n) if j != i])
             for i in range(n)]
    np.testing.assert_allclose(fast, brute, rtol=1e-9, atol=1e-12)


def test_fast_ndtr_error_bound():
    """The logistic normal CDF used by the scoring job stays within 1.5e-4 of the exact one."""
    z = np.linspace(-12, 12, 100_001).astype(np.float32)
    assert np.abs(fast_ndtr(z) - ndtr(z.astype(np.float64))).max() < 1.5e-4


@pytest.mark.parametrize("medians", [[2e5], [3e4, 1.5e5], [5e3, 2e4, 1.2e5]])
def test_reconstruction_error_is_small(medians):
    """A mixture rebuilt from (count, p50, p99) per cluster is within 2% of the median in W1."""
    rng = np.random.default_rng(len(medians))
    dur = np.concatenate([rng.lognormal(np.log(m), 0.08, 5000) for m in medians])
    table = compress(np.zeros(len(dur), dtype=np.int64), dur.astype(np.int64))
    mu, sigma = lognormal_params(table.p50_ns, table.p99_ns)
    u = (np.arange(20_000) + 0.5) / 20_000
    rebuilt = mixture_quantile(u, table.count.astype(float), mu, sigma)
    assert wasserstein_distance(dur, rebuilt) / np.median(dur) < 0.02


def test_lognormal_params_degenerate():
    """p99 == p50 (identical durations) still yields a valid, very thin component."""
    mu, sigma = lognormal_params(np.array([1000.0]), np.array([1000.0]))
    assert mu[0] == pytest.approx(np.log(1000)) and 0 < sigma[0] <= 1e-3
