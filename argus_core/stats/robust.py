"""Robust location, scale and fences for small peer groups.

Peer groups in parallel training are small (a TP group of 4, a PP group of 8): sample means and
standard deviations are dragged by the very outlier being looked for, and a sample z-score can
never exceed (n-1)/sqrt(n) (2.47 at n = 8). Medians and the MAD do not have that ceiling.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.special import ndtri, stdtrit

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this = its standard deviation


def nanmedian(values: np.ndarray, axis: int | tuple[int, ...] | None = None) -> np.ndarray:
    """np.nanmedian where an all-NaN slice quietly gives NaN (missing data is expected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, axis=axis)


def robust_z(values: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(values - center) / scale with a zero scale treated as 'no spread' (z = 0 or inf)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (values - center) / scale
    return np.where(scale > 0, z, np.where(values > center, np.inf, 0.0))


def median_of_others(values: np.ndarray) -> np.ndarray:
    """For each entry of a (..., N) array, the median of the other N-1 entries of its row.

    Sort once; without entry i the remaining sorted row is v[j + (j >= i)], so its median is
    read off at two positions: O(N log N) per row instead of N medians. NaN entries are
    ignored (rows are handled by the slow path when they contain any).
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    if n < 2:
        return np.full(values.shape, np.nan)
    nan_rows = np.isnan(values).any(axis=-1)
    order = np.argsort(values, axis=-1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=-1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.arange(n), axis=-1)  # rank of each entry
    m = n - 1
    lo_j, hi_j = (m - 1) // 2, m // 2
    lo = np.take_along_axis(ranked, lo_j + (lo_j >= position), axis=-1)
    hi = np.take_along_axis(ranked, hi_j + (hi_j >= position), axis=-1)
    out = (lo + hi) / 2
    if nan_rows.any():
        rows = values[nan_rows]
        slow = np.empty_like(rows)
        for i in range(n):
            slow[..., i] = nanmedian(np.delete(rows, i, axis=-1), axis=-1)
        out[nan_rows] = slow
    return out


def mad_sigma(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Normal-consistent MAD scale along an axis (NaN ignored)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        center = np.nanmedian(values, axis=axis, keepdims=True)
        return MAD_TO_SIGMA * np.nanmedian(np.abs(values - center), axis=axis)


def family_z(n_tests: int, alpha: float = 0.01) -> float:
    """One-sided normal quantile that keeps the family-wise false-alarm rate near ``alpha``.

    Used so that the expected number of false positives does not grow with the number of ranks
    or groups tested (Bonferroni).
    """
    return float(ndtri(1.0 - alpha / max(n_tests, 1)))


def t_widening(dof: np.ndarray, p: float) -> np.ndarray:
    """How much wider a one-sided Student-t quantile at 1 - p is than the normal's.

    A spread estimated from a few steps is itself uncertain; multiplying it by this factor
    makes a normal threshold at 1 - p behave like the t test it should be.
    """
    p = min(max(p, 1e-15), 0.5)
    dof = np.maximum(np.asarray(dof, dtype=np.float64), 1.0)
    distinct, inverse = np.unique(dof, return_inverse=True)  # counts repeat: invert each once
    return (stdtrit(distinct, 1.0 - p) / float(ndtri(1.0 - p)))[inverse].reshape(dof.shape)


def lower_half_centre_spread(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre and normal-consistent spread of each row of (U, N) values, from the faster half.

    The 5th and 25th percentiles of a row come from its lower half, which stays healthy while
    up to half of the row is degraded: sigma = (q25 - q05) / 0.9706 and centre = q25 +
    0.6745 sigma (the median, were the row normal).
    """
    q05, q25 = np.quantile(values, [0.05, 0.25], axis=-1)
    sigma = (q25 - q05) / 0.9706  # z(0.25) - z(0.05) for a normal
    return q25 + 0.6745 * sigma, sigma


def healthy_centre_spread(values: np.ndarray, split: float = 4.0,
                          typical: np.ndarray | float = 0.0,
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Centre and spread of the healthy ranks in each row of (U, N) values.

    Two readings of a row: its middle (median, and the interquartile range / 1.349) and its
    faster half (``lower_half_centre_spread``). When the middle is no more than ``split``
    times wider than the spread expected (the faster half's, or ``typical``: what rows of the
    same kind show, for rows too short to estimate it), the row is one population, maybe
    skewed, and the middle is used (the more efficient estimate, honest about a long upper
    tail). When it is much wider, the upper part of the row is degraded (up to half of it,
    the paper's case 2) and only the faster half is trusted.
    """
    q05, q25, q50, q75 = np.quantile(values, [0.05, 0.25, 0.5, 0.75], axis=-1)
    return centre_spread(q05, q25, q50, q75, split, typical)


def centre_spread(q05: np.ndarray, q25: np.ndarray, q50: np.ndarray, q75: np.ndarray,
                  split: float = 4.0, typical: np.ndarray | float = 0.0,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``healthy_centre_spread`` from a row's 5th, 25th, 50th and 75th percentiles."""
    low = (q25 - q05) / 0.9706  # z(0.25) - z(0.05) for a normal
    mid = (q75 - q25) / 1.349
    expected = np.maximum(low, typical)
    one_population = mid <= split * expected
    centre = np.where(one_population, q50, q25 + 0.6745 * low)
    spread = np.where(one_population, np.maximum(mid, expected), expected)
    return centre, spread
