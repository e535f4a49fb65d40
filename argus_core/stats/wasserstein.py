"""Wasserstein-1 (earth mover's) distances between distributions given as CDFs on a grid.

W1(F, G) = integral |F(t) - G(t)| dt. It reacts to a shifted median and to a fattened tail
alike and stays finite when supports differ slightly: the properties fail-slow needs (paper,
section 6.2). Here it is split by direction: ``excess_w1`` keeps only the mass of F that lies
to the right of the reference (slower), so a rank that is faster is never a straggler.
"""

from __future__ import annotations

import numpy as np


def trapezoid_weights(t: np.ndarray) -> np.ndarray:
    """Integration weights for a function sampled at increasing points ``t`` (last axis)."""
    dt = np.diff(t, axis=-1)
    w = np.zeros_like(t)
    w[..., :-1] += dt / 2
    w[..., 1:] += dt / 2
    return w


def excess_w1(cdf: np.ndarray, ref_cdf: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Directional W1: integral of max(ref(t) - F(t), 0) dt, the mass of F slower than ref.

    ``cdf`` is (..., N, M), ``ref_cdf`` and ``weights`` are (..., M). Returns (..., N).
    """
    gap = np.maximum(ref_cdf[..., None, :] - cdf, 0.0)
    return np.einsum("...nm,...m->...n", gap, weights)


def w1(cdf: np.ndarray, ref_cdf: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Plain (two-sided) W1 of each row of ``cdf`` to ``ref_cdf`` on a shared grid."""
    return np.einsum("...nm,...m->...n", np.abs(ref_cdf[..., None, :] - cdf), weights)


def mean_from_cdf(cdf: np.ndarray, t: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Mean of a non-negative distribution from its CDF on a grid: t0 + integral (1 - F) dt."""
    return t[..., 0] + np.einsum("...m,...m->...", 1.0 - cdf, weights)


def mean_w1_to_peers(cdf: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Mean W1 of every row to all other rows, in O(M N log N) instead of O(M N^2).

    At each grid point the sum over peers of |F_r - F_s| follows from the sorted column and
    its prefix sums: for the i-th smallest value v_i of n, sum_s |v_i - v_s| =
    v_i (2i - n) + S_total - 2 S_i  (S_i = sum of the i smallest values before v_i, 0-based i).
    ``cdf`` is (N, M); returns (N,). This is the paper's score, kept for comparison.
    """
    n = cdf.shape[0]
    if n < 2:
        return np.zeros(n)
    order = np.argsort(cdf, axis=0, kind="stable")
    sorted_vals = np.take_along_axis(cdf, order, axis=0)
    prefix = np.cumsum(sorted_vals, axis=0) - sorted_vals  # sum of the values before i
    total = sorted_vals.sum(axis=0)
    i = np.arange(n)[:, None]
    sums_sorted = sorted_vals * (2 * i - n) + total - 2 * prefix
    sums = np.empty_like(sums_sorted)
    np.put_along_axis(sums, order, sums_sorted, axis=0)
    return sums @ weights / (n - 1)
