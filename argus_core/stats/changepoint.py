"""Change points in a series' mean by binary segmentation (CUSUM statistic, robust noise scale)."""

from __future__ import annotations

import numpy as np

from argus_core.stats.robust import MAD_TO_SIGMA


def noise_scale(y: np.ndarray, floor: float = 0.0) -> float:
    """Robust standard deviation of step-to-step noise: MAD of first differences / sqrt 2.

    A level shift changes only one difference, so it does not inflate the estimate.
    """
    if len(y) < 3:
        return floor
    diffs = np.diff(y)
    return max(float(MAD_TO_SIGMA * np.median(np.abs(diffs - np.median(diffs))) / np.sqrt(2)),
               floor)


def change_points(y: np.ndarray, threshold: float, min_segment: int, min_shift: float,
                  sigma: float) -> list[int]:
    """Indices where the mean of ``y`` shifts, sorted.

    Splits recursively at the point maximising |mean(right) - mean(left)| * sqrt(k(n-k)/n) /
    sigma while that statistic exceeds ``threshold`` and the shift exceeds ``min_shift``.
    """
    found: list[int] = []
    pending = [(0, len(y))]
    while pending:
        lo, hi = pending.pop()
        n = hi - lo
        if n < 2 * min_segment or sigma <= 0:
            continue
        seg = y[lo:hi]
        csum = np.cumsum(seg)
        k = np.arange(min_segment, n - min_segment + 1)
        left = csum[k - 1] / k
        right = (csum[-1] - csum[k - 1]) / (n - k)
        shift = right - left
        stat = np.abs(shift) * np.sqrt(k * (n - k) / n) / sigma
        best = int(np.argmax(stat))
        if stat[best] >= threshold and abs(shift[best]) >= min_shift:
            split = lo + int(k[best])
            found.append(split)
            pending += [(lo, split), (split, hi)]
    return sorted(found)
