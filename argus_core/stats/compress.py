"""Online kernel-time compression by KDE valley clustering (ARGUS paper, section 5.2).

For every group of durations (one kernel on one stream of one rank in one time window):
log-transform, estimate a Gaussian KDE with Scott's bandwidth, split at density valleys, and
keep per cluster its count, sum, min, max, p50 and p99. Multimodal kernels (a small and a large
AllGather under one name) keep their modes apart; a window of millions of events becomes a few
numbers per group.

All groups are processed at once: each group gets its own log-spaced grid spanning its own
range (no fixed duration ceiling), events are binned with one ``bincount``, every group's
histogram is smoothed in one batched FFT, and valleys are found and filtered with array
operations. Cost is O(events + groups x grid); quantiles come from the per-group histogram,
interpolated within a bin and clamped to the cluster's exact min and max, so their error is
below one grid step (range / grid_size in log space, typically < 0.5% of the duration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.fft

from argus_core.stats.grouping import first_of, group_starts

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
    config = config or CompressionConfig()
    group = np.asarray(group, dtype=np.int64)
    n_groups = int(group.max()) + 1 if n_groups is None and len(group) else (n_groups or 0)
    x = np.log(np.maximum(np.asarray(dur_ns, dtype=np.float64), 1.0))
    grid = config.grid_size

    count = np.bincount(group, minlength=n_groups).astype(np.float64)
    present = count > 0
    safe_count = np.maximum(count, 1.0)
    mean = np.bincount(group, x, minlength=n_groups) / safe_count
    var = np.bincount(group, x * x, minlength=n_groups) / safe_count - mean * mean
    sigma = np.sqrt(np.maximum(var, 0.0))
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, group, x)
    np.maximum.at(hi, group, x)
    lo[~present] = hi[~present] = 0.0

    # Each group's own grid: its range plus 3 bandwidths each side (no fixed ceiling).
    bandwidth = sigma * safe_count ** -0.2  # Scott's rule in one dimension
    origin = lo - 3 * bandwidth
    width = np.maximum(hi - lo + 6 * bandwidth, 1e-9)  # identical durations: a tiny grid
    step = width / grid
    bin_of_event = np.clip(((x - origin[group]) / step[group]).astype(np.int64), 0, grid - 1)
    flat_bin = group * grid + bin_of_event
    hist = np.bincount(flat_bin, minlength=n_groups * grid).reshape(n_groups, grid)

    boundaries = _valley_boundaries(hist, count, bandwidth / step, step, config)
    return _summarise(group, x, dur_ns, flat_bin, hist, boundaries, origin, step, n_groups)


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


def _summarise(group: np.ndarray, x: np.ndarray, dur_ns: np.ndarray, flat_bin: np.ndarray,
               hist: np.ndarray, boundaries: tuple[np.ndarray, np.ndarray], origin: np.ndarray,
               step: np.ndarray, n_groups: int) -> ClusterTable:
    """Per-cluster count, sum, min, max and interpolated histogram quantiles."""
    grid = hist.shape[1]
    b_group, b_bin = boundaries
    n_clusters = 1 + np.bincount(b_group, minlength=n_groups)
    n_clusters[np.bincount(group, minlength=n_groups) == 0] = 0
    first = np.r_[0, np.cumsum(n_clusters)[:-1]]
    total = int(n_clusters.sum())

    # Cluster bin ranges [start, end) within the group's grid.
    c_group = np.repeat(np.arange(n_groups), n_clusters)
    c_index = np.arange(total) - first[c_group]
    c_start = np.zeros(total, dtype=np.int64)
    rank_in_group = np.arange(len(b_group)) - first_of(b_group)
    c_start[first[b_group] + rank_in_group + 1] = b_bin
    nxt_same = np.r_[c_group[1:] == c_group[:-1], False]
    c_end = np.where(nxt_same, np.r_[c_start[1:], 0], grid)

    # Cluster of every event: boundaries marked on the grid, cumulated along each row.
    marks = np.zeros(n_groups * grid, dtype=np.int16)
    marks[b_group * grid + b_bin] = 1
    cluster_of_bin = np.cumsum(marks.reshape(n_groups, grid), axis=1, dtype=np.int16).ravel()
    cid = first[group] + cluster_of_bin[flat_bin]
    count = np.bincount(cid, minlength=total)
    sums = np.bincount(cid, np.asarray(dur_ns, dtype=np.float64), minlength=total)
    lo = np.full(total, np.inf)
    hi = np.full(total, -np.inf)
    np.minimum.at(lo, cid, x)
    np.maximum.at(hi, cid, x)

    cumulative = np.r_[0, np.cumsum(hist.ravel())]
    base = cumulative[c_group * grid + c_start]
    flat_hist = hist.ravel()
    quantiles = []
    for q in QUANTILES:
        # Sample i (0-based, sorted) sits at cumulative rank i + 0.5, so this matches
        # numpy's default (linear) percentile definition q * (n - 1) on exact data.
        target = base + q * (count - 1) + 0.5
        j = np.searchsorted(cumulative, target, side="left") - 1
        j = np.clip(j, c_group * grid + c_start, c_group * grid + c_end - 1)
        within = (target - cumulative[j]) / np.maximum(flat_hist[j], 1)
        log_q = origin[c_group] + (j - c_group * grid + np.clip(within, 0, 1)) * step[c_group]
        quantiles.append(np.exp(np.clip(log_q, lo, hi)))
    # Durations are >= 1 ns after the log clamp; report what was measured.
    return ClusterTable(
        group=c_group, cluster=c_index.astype(np.int16), count=count.astype(np.int64),
        sum_ns=sums, min_ns=np.exp(lo), max_ns=np.exp(hi),
        p50_ns=quantiles[0], p99_ns=quantiles[1])

