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


DRIFT_BATCH = 5  # steps per batch when reading a series' drift


def drift_noise_scale(y: np.ndarray, sigma: float, batch: int = DRIFT_BATCH) -> float:
    """``sigma`` (step-to-step noise), widened to what the series' drift says: a mean over
    many steps wanders more than independent steps would when consecutive steps are alike
    (real ranks drift for a few steps). Read from the medians of consecutive ``batch``-step
    batches: the MAD of their first differences (one level shift moves one of them), as the
    per-step noise that independent steps would need to scatter batch medians that much."""
    batches = len(y) // batch
    if batches < 4:
        return sigma
    medians = np.median(y[:batches * batch].reshape(batches, batch), axis=1)
    spread = MAD_TO_SIGMA * np.median(np.abs(np.diff(medians))) / np.sqrt(2)
    return max(sigma, float(spread * np.sqrt(batch / (np.pi / 2))))


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


_ONSET_CHUNK_CELLS = 2_000_000  # series x split points evaluated at once


def row_noise(y: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Step-to-step noise (standard deviation) of every row of a (rows x n) array without NaN.

    The RMS of first differences / sqrt 2, leaving out the largest one: a level shift moves
    only one difference, while occasional large steps (MoE drops, stalls) are noise a shift
    test must not mistake for a change. Vectorised; never below ``floor``.
    """
    if y.shape[1] < 3:
        return np.full(len(y), floor)
    diffs = np.sort(np.abs(np.diff(y, axis=1)), axis=1)[:, :-1]
    return np.maximum(np.sqrt(np.mean(diffs ** 2, axis=1) / 2), floor)


def upward_shifts(y: np.ndarray, min_segment: int, sigma: np.ndarray,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Most likely onset of an upward mean shift in every row of a (rows x n) array.

    Returns, per row, the first index of the later segment (-1 when the row is too short)
    and the CUSUM statistic of the split: (mean after - mean before) * sqrt(k (n-k) / n) /
    sigma, positive for a slowdown. Both segments hold at least ``min_segment`` values; rows
    must not contain NaN.
    """
    rows, n = y.shape
    onset = np.full(rows, -1, dtype=np.int64)
    stat = np.zeros(rows)
    if n < 2 * min_segment or rows == 0:
        return onset, stat
    k = np.arange(min_segment, n - min_segment + 1)
    weight = np.sqrt(k * (n - k) / n)
    per_chunk = max(1, _ONSET_CHUNK_CELLS // len(k))
    for lo in range(0, rows, per_chunk):
        part = y[lo:lo + per_chunk]
        csum = np.cumsum(part, axis=1)
        left = csum[:, k - 1] / k
        right = (csum[:, -1:] - csum[:, k - 1]) / (n - k)
        z = (right - left) * weight / sigma[lo:lo + per_chunk, None]
        best = np.argmax(z, axis=1)
        onset[lo:lo + per_chunk] = k[best]
        stat[lo:lo + per_chunk] = z[np.arange(len(part)), best]
    return onset, stat
