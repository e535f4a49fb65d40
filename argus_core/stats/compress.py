"""Online kernel-time compression by KDE valley clustering (ARGUS paper, section 5.2).

For every group of durations (one kernel on one stream of one rank in one time window):
log-transform, estimate a Gaussian KDE with Scott's bandwidth, split at density valleys, and
keep per cluster its count, sum, min, max, p50 and p99. Multimodal kernels (a small and a large
AllGather under one name) keep their modes apart; a window of millions of events becomes a few
numbers per group.

Durations first go into a :class:`~argus_core.stats.sketch.DurationSketch` (exact moments and
extremes, plus a 0.2%-wide log histogram per group), so a window can be absorbed batch by
batch in fixed memory. Then all groups are clustered at once: each group gets its own
log-spaced KDE grid spanning its own range (no fixed duration ceiling), the fine bins are
re-binned onto it with one ``bincount``, every group's histogram is smoothed in one batched
FFT, and valleys are found and filtered with array operations. Cost is O(events + groups x
grid). Counts, sums and extremes are exact; quantiles are interpolated within a fine bin and
clamped to the cluster's min and max, so their error is below 0.2% of the duration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.fft

from argus_core.stats.grouping import group_starts
from argus_core.stats.sketch import BIN_WIDTH, BatchSketch, DurationSketch

QUANTILES = (0.5, 0.99)


@dataclass(frozen=True)
class CompressionConfig:
    """Knobs of the valley clustering; the defaults suit CUPTI kernel durations."""

    grid_size: int = 512  # KDE grid points per group
    min_cluster_samples: int = 10  # each side of an accepted valley holds at least this many
    min_cluster_fraction: float = 0.01  # ... and at least this fraction of the group
    min_log_gap: float = 0.1  # boundaries at least this far apart in ln(duration) (~10%)
    max_valley_ratio: float = 0.7  # valley density <= this x the lower neighbouring peak
    max_clusters: int = 8

    def __post_init__(self) -> None:
        if self.grid_size < 16:
            raise ValueError(f"grid_size must be >= 16, got {self.grid_size}")
        if self.max_clusters < 1:
            raise ValueError(f"max_clusters must be >= 1, got {self.max_clusters}")
        if not 0 < self.max_valley_ratio <= 1:
            raise ValueError(f"max_valley_ratio must be in (0, 1], got {self.max_valley_ratio}")


@dataclass
class ClusterTable:
    """One row per cluster, grouped by ``group`` and ordered by duration within a group."""

    group: np.ndarray  # int64 group index
    cluster: np.ndarray  # int16 index within the group, 0 = fastest
    count: np.ndarray  # int64
    sum_ns: np.ndarray  # float64
    min_ns: np.ndarray
    max_ns: np.ndarray
    p50_ns: np.ndarray
    p99_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.group)


def compress(group: np.ndarray, dur_ns: np.ndarray, n_groups: int | None = None,
             config: CompressionConfig | None = None) -> ClusterTable:
    """Cluster each group's durations at KDE valleys and summarise every cluster.

    ``group`` holds dense group ids (0..n_groups-1) and ``dur_ns`` the durations in ns (>= 0;
    0 is treated as 1 ns). Groups with no events produce no rows.
    """
    return compress_sketch(BatchSketch.of(group, dur_ns, n_groups), config)


def compress_sketch(sketch: DurationSketch | BatchSketch, config: CompressionConfig | None = None,
                    ) -> ClusterTable:
    """Cluster every group of a duration sketch at KDE valleys and summarise every cluster.

    The sketch's fine bins (0.2% wide) are re-binned onto each group's KDE grid; the KDE
    bandwidth is Scott's rule on the exact moments, and never narrower than a fine bin (the
    histogram's own resolution). Counts, sums, minima and maxima of groups are exact; cluster
    quantiles are interpolated within a fine bin and clamped to the cluster's extremes.
    """
    config = config or CompressionConfig()
    grid = config.grid_size
    n_groups = sketch.n_groups
    count = sketch.count.astype(np.float64)
    present = count > 0
    safe_count = np.maximum(count, 1.0)
    mean = sketch.sum_x / safe_count
    sigma = np.sqrt(np.maximum(sketch.sum_x2 / safe_count - mean * mean, 0.0))
    lo = np.where(present, np.log(np.where(present, sketch.min_ns, 1.0)), 0.0)
    hi = np.where(present, np.log(np.where(present, sketch.max_ns, 1.0)), 0.0)

    # Each group's own grid: its range plus 3 bandwidths each side (no fixed ceiling).
    bandwidth = np.maximum(sigma * safe_count ** -0.2, BIN_WIDTH)  # Scott's rule, >= a bin
    origin = lo - 3 * bandwidth
    step = np.maximum(hi - lo + 6 * bandwidth, 1e-9) / grid

    e_group, e_bin, e_count = sketch.occupied()
    e_lo = np.clip(e_bin * BIN_WIDTH, lo[e_group], hi[e_group])  # each bin's span, clamped
    e_hi = np.clip((e_bin + 1) * BIN_WIDTH, lo[e_group], hi[e_group])  # to the exact extremes
    # A group's first and last bins start and end at its extremes, even where a logarithm
    # rounded across a bin edge put an extreme one bin off (the extremes stay exact).
    first = group_starts(e_group)
    last = np.append(first[1:], len(e_group))[: len(first)] - 1
    e_lo[first] = lo[e_group[first]]
    e_hi[last] = hi[e_group[last]]
    cell = np.clip(((0.5 * (e_lo + e_hi) - origin[e_group]) / step[e_group]).astype(np.int64),
                   0, grid - 1)
    flat_cell = e_group * grid + cell
    hist = np.bincount(flat_cell, e_count, minlength=n_groups * grid).reshape(n_groups, grid)

    boundaries = _valley_boundaries(hist, count, bandwidth / step, step, config)
    return _summarise(sketch, _Bins(e_group, e_lo, e_hi, e_count, flat_cell), boundaries,
                      n_groups, grid)


@dataclass
class _Bins:
    """The sketch's occupied fine bins, in layout order (group, then duration)."""

    group: np.ndarray
    lo: np.ndarray  # ln of the bin's lower edge, clamped to the group's minimum
    hi: np.ndarray  # ln of the upper edge, clamped to the group's maximum
    count: np.ndarray
    cell: np.ndarray  # group * grid + the KDE grid cell the bin falls in


def kde_density(hist: np.ndarray, bandwidth_bins: np.ndarray) -> np.ndarray:
    """Gaussian KDE of each histogram row (binned KDE via FFT); bandwidth in bins per row.

    The grids carry 3 bandwidths of empty margin on each side, so the circular convolution's
    wrap-around is below exp(-18) of the peak and is ignored.
    """
    grid = hist.shape[1]
    freqs = np.fft.rfftfreq(grid).astype(np.float32)
    transfer = np.exp(-2.0 * np.pi**2 * (bandwidth_bins.astype(np.float32)[:, None] * freqs) ** 2)
    density = scipy.fft.irfft(scipy.fft.rfft(hist.astype(np.float32), axis=1) * transfer,
                              n=grid, axis=1)
    # FFT round-off leaves +-1e-7 ripples where the density is zero; they are not valleys.
    density[density < 1e-5 * density.max(axis=1, keepdims=True)] = 0.0
    return density


def _valley_boundaries(hist: np.ndarray, count: np.ndarray, bandwidth_bins: np.ndarray,
                       step: np.ndarray, config: CompressionConfig) -> tuple[np.ndarray, ...]:
    """Accepted (group, bin) cluster boundaries, sorted by group then bin."""
    _n_groups, grid = hist.shape
    min_side = np.maximum(config.min_cluster_samples, config.min_cluster_fraction * count)
    eligible = (count >= 2 * min_side) & (bandwidth_bins > 0)
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if config.max_clusters == 1 or not eligible.any():
        return none
    rows = np.flatnonzero(eligible)
    density = kde_density(hist[rows], bandwidth_bins[rows])

    # Peaks: strictly above the left neighbour, not below the right one.
    inner = density[:, 1:-1]
    peak = np.zeros_like(density, dtype=bool)
    peak[:, 1:-1] = (inner > density[:, :-2]) & (inner >= density[:, 2:])
    peak_row, peak_col = np.nonzero(peak)
    pair = peak_row[1:] == peak_row[:-1]
    if not pair.any():
        return none
    row = peak_row[:-1][pair]
    left, right = peak_col[:-1][pair], peak_col[1:][pair]

    # Valley = lowest point strictly between two consecutive peaks (first one on a plateau).
    lengths = right - left - 1
    starts = row * grid + left + 1
    seg_start = np.r_[0, np.cumsum(lengths)[:-1]]
    positions = np.repeat(starts - seg_start, lengths) + np.arange(lengths.sum())
    values = density.ravel()[positions]
    valley_value = np.minimum.reduceat(values, seg_start)
    at_min = values == np.repeat(valley_value, lengths)
    valley_pos = np.minimum.reduceat(np.where(at_min, positions, np.iinfo(np.int64).max),
                                     seg_start)
    valley_col = valley_pos - row * grid
    lower_peak = np.minimum(density[row, left], density[row, right])
    depth = valley_value / np.maximum(lower_peak, 1e-30)
    deep = depth <= config.max_valley_ratio
    row, valley_col, depth = row[deep], valley_col[deep], depth[deep]
    if len(row) == 0:
        return none

    # Greedy acceptance, deepest valley first, vectorised over groups (loop over rank k).
    group = rows[row]
    order = np.lexsort((depth, group))
    group, valley_col = group[order], valley_col[order]
    starts = group_starts(group)
    k_in_group = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts, len(group)]))
    slot = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(group)]))
    slot_group = group[starts]
    cum = np.zeros((len(starts), grid + 1))
    cum[:, 1:] = np.cumsum(hist[slot_group], axis=1)  # events in bins < j
    max_bounds = config.max_clusters - 1
    accepted = np.full((len(starts), max_bounds), -1, dtype=np.int64)
    n_accepted = np.zeros(len(starts), dtype=np.int64)
    for k in range(int(k_in_group.max()) + 1):
        idx = np.flatnonzero(k_in_group == k)
        s, v = slot[idx], valley_col[idx]
        current = accepted[s]
        left_b = np.where((current >= 0) & (current < v[:, None]), current, 0).max(axis=1)
        right_b = np.where(current > v[:, None], current, grid).min(axis=1)
        row_cum = cum[s]
        take = np.arange(len(s))
        n_left = row_cum[take, v] - row_cum[take, left_b]
        n_right = row_cum[take, right_b] - row_cum[take, v]
        need = min_side[slot_group[s]]
        gap = config.min_log_gap / step[slot_group[s]]
        ok = (n_left >= need) & (n_right >= need) & (n_accepted[s] < max_bounds)
        ok &= ((left_b == 0) | (v - left_b >= gap)) & ((right_b == grid) | (right_b - v >= gap))
        accepted[s[ok], n_accepted[s[ok]]] = v[ok]
        n_accepted[s[ok]] += 1
    keep = accepted >= 0
    out_group = np.broadcast_to(slot_group[:, None], accepted.shape)[keep]
    out_bin = accepted[keep]
    order = np.lexsort((out_bin, out_group))
    return out_group[order], out_bin[order]


def _summarise(sketch: DurationSketch | BatchSketch, bins: _Bins,
               boundaries: tuple[np.ndarray, np.ndarray], n_groups: int, grid: int,
               ) -> ClusterTable:
    """Per-cluster count, sum, min, max and quantiles interpolated within the fine bins."""
    b_group, b_cell = boundaries
    n_clusters = 1 + np.bincount(b_group, minlength=n_groups)
    n_clusters[sketch.count == 0] = 0
    first = np.r_[0, np.cumsum(n_clusters)[:-1]]
    total = int(n_clusters.sum())
    c_group = np.repeat(np.arange(n_groups), n_clusters)
    c_index = np.arange(total) - first[c_group]

    # Cluster of every fine bin: boundaries marked on the grid, cumulated along each row.
    marks = np.zeros(n_groups * grid, dtype=np.int16)
    marks[b_group * grid + b_cell] = 1
    cluster_of_cell = np.cumsum(marks.reshape(n_groups, grid), axis=1, dtype=np.int16).ravel()
    cid = first[bins.group] + cluster_of_cell[bins.cell]  # non-decreasing: bins are in order
    count = np.bincount(cid, bins.count, minlength=total).astype(np.int64)
    # Sums: bin midpoints, rescaled so that every group's total is its exact sum.
    approx = bins.count * np.exp(0.5 * (bins.lo + bins.hi))
    per_group = np.bincount(bins.group, approx, minlength=n_groups)
    scale = sketch.sum_ns / np.where(per_group > 0, per_group, 1.0)
    sums = np.bincount(cid, approx, minlength=total) * scale[c_group]

    c_first = np.searchsorted(cid, np.arange(total), side="left")
    c_last = np.maximum(np.searchsorted(cid, np.arange(total), side="right") - 1, c_first)
    lo, hi = bins.lo[c_first], bins.hi[c_last]
    cumulative = np.r_[0, np.cumsum(bins.count)]
    quantiles = []
    for q in QUANTILES:
        # Sample i (0-based, sorted) sits at cumulative rank i + 0.5, so this matches
        # numpy's default (linear) percentile definition q * (n - 1) on exact data.
        target = cumulative[c_first] + q * (count - 1) + 0.5
        j = np.clip(np.searchsorted(cumulative, target, side="left") - 1, c_first, c_last)
        within = np.clip((target - cumulative[j]) / np.maximum(bins.count[j], 1), 0.0, 1.0)
        log_q = bins.lo[j] + within * (bins.hi[j] - bins.lo[j])
        quantiles.append(np.exp(np.clip(log_q, lo, hi)))
    # A group's outer clusters take its measured extremes (exp(ln(x)) is not always x).
    min_ns = np.where(c_index == 0, sketch.min_ns[c_group], np.exp(lo))
    max_ns = np.where(c_index == n_clusters[c_group] - 1, sketch.max_ns[c_group], np.exp(hi))
    return ClusterTable(
        group=c_group, cluster=c_index.astype(np.int16), count=count, sum_ns=sums,
        min_ns=min_ns, max_ns=max_ns, p50_ns=np.clip(quantiles[0], min_ns, max_ns),
        p99_ns=np.clip(quantiles[1], min_ns, max_ns))
