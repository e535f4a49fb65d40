"""Kernels into steps, rank by rank, and a check that kernels and steps share a time base.

Ranks' clocks differ by milliseconds and each rank starts its steps at its own time, so a
kernel is placed by its own rank's step starts (``steps.step_start_ns``), never by a job-wide
one. CUPTI timestamps and the steps' ``t_ns`` must be on the same clock (CLOCK_REALTIME);
kernels falling outside every step of their rank by more than a tolerance mean they are not
(a TSC time base, a wrong clock), and are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.steps import StepMatrix
from argus_core.trace import KernelTable

TIME_BASE_TOLERANCE_NS = 1_000_000_000  # kernels this far outside every step are misplaced
TIME_BASE_SHARE = 0.1  # warn when more than this share of a rank's kernels are


@dataclass
class Placement:
    """Step column (into ``matrix.steps``) of every kernel, -1 when outside its rank's steps."""

    step_col: np.ndarray
    outside: np.ndarray  # bool per kernel: more than the tolerance outside every step
    warnings: list[str]


def place_kernels(kernels: KernelTable, matrix: StepMatrix,
                  tolerance_ns: int = TIME_BASE_TOLERANCE_NS) -> Placement:
    """Place each kernel into the step of its own rank that was running when it started."""
    n = len(kernels)
    step_col = np.full(n, -1, dtype=np.int64)
    outside = np.zeros(n, dtype=bool)
    if n == 0 or len(matrix.steps) == 0 or matrix.start_ns is None:
        return Placement(step_col, outside, [])
    # One searchsorted for all ranks: each rank's times are shifted into its own band of a
    # common axis (rank row * span + time - earliest), so steps of another rank never match.
    row = np.searchsorted(matrix.ranks, kernels.rank)
    known = (row < len(matrix.ranks))
    known[known] = matrix.ranks[row[known]] == kernels.rank[known]
    rec_row, rec_col = np.nonzero(matrix.start_ns >= 0)
    if len(rec_row) == 0 or not known.any():
        return Placement(step_col, outside, [])
    starts = matrix.start_ns[rec_row, rec_col]
    ends = starts + (np.nan_to_num(matrix.wall[rec_row, rec_col], nan=0.0) * 1e9).astype(np.int64)
    t = kernels.start_ns[known]
    k_row = row[known]
    lo = min(int(starts.min()), int(t.min())) - tolerance_ns - 1
    span = max(int(ends.max()), int(t.max())) + tolerance_ns + 1 - lo
    if span * (len(matrix.ranks) + 1) >= 2**62:  # times too spread for one axis: per rank
        return _place_per_rank(kernels, matrix, tolerance_ns)
    step_key = rec_row * span + (starts - lo)
    order = np.argsort(step_key, kind="stable")  # a rank's steps in time order
    step_key, rec_row, rec_col, starts = (a[order] for a in (step_key, rec_row, rec_col, starts))
    ends = ends[order]
    kernel_key = k_row * span + (t - lo)
    pos = np.searchsorted(step_key, kernel_key, side="right") - 1
    same_rank = (pos >= 0) & (rec_row[np.maximum(pos, 0)] == k_row)
    placed_col = np.where(same_rank, rec_col[np.maximum(pos, 0)], -1)
    step_col[known] = placed_col
    # Far outside: before the rank's first step or after its last step's end.
    first = np.full(len(matrix.ranks), np.iinfo(np.int64).max)
    last_end = np.full(len(matrix.ranks), np.iinfo(np.int64).min)
    np.minimum.at(first, rec_row, starts)
    np.maximum.at(last_end, rec_row, ends)
    has_steps = first[k_row] < np.iinfo(np.int64).max
    far = has_steps & ((t < first[k_row] - tolerance_ns) | (t > last_end[k_row] + tolerance_ns))
    outside[known] = far
    misplaced = _misplaced(k_row, far, t, np.where(same_rank, starts[np.maximum(pos, 0)],
                                                    first[k_row]), matrix.ranks)
    return Placement(step_col, outside, _time_base_warnings(misplaced, tolerance_ns))


def _misplaced(k_row: np.ndarray, far: np.ndarray, t: np.ndarray, anchor: np.ndarray,
               ranks: np.ndarray) -> list[tuple[int, float, float]]:
    """(rank, share outside, median offset in s) for ranks with too many kernels outside."""
    total = np.bincount(k_row, minlength=len(ranks))
    bad = np.bincount(k_row[far], minlength=len(ranks))
    out = []
    for r in np.flatnonzero(bad > TIME_BASE_SHARE * np.maximum(total, 1)).tolist():
        mine = far & (k_row == r)
        out.append((int(ranks[r]), float(bad[r] / total[r]),
                    float(np.median(t[mine] - anchor[mine])) * 1e-9))
    return out


def _place_per_rank(kernels: KernelTable, matrix: StepMatrix, tolerance_ns: int) -> Placement:
    """The same placement, one rank at a time (times spread too far for one axis)."""
    n = len(kernels)
    step_col = np.full(n, -1, dtype=np.int64)
    outside = np.zeros(n, dtype=bool)
    misplaced = []
    for r_index, rank in enumerate(matrix.ranks.tolist()):
        idx = np.flatnonzero(kernels.rank == rank)
        recorded = np.flatnonzero(matrix.start_ns[r_index] >= 0)
        if len(idx) == 0 or len(recorded) == 0:
            continue
        starts = matrix.start_ns[r_index, recorded]
        ends = starts + (np.nan_to_num(matrix.wall[r_index, recorded]) * 1e9).astype(np.int64)
        t = kernels.start_ns[idx]
        pos = np.searchsorted(starts, t, side="right") - 1
        step_col[idx[pos >= 0]] = recorded[pos[pos >= 0]]
        far = (t < starts[0] - tolerance_ns) | (t > ends.max() + tolerance_ns)
        outside[idx] = far
        if far.mean() > TIME_BASE_SHARE:
            misplaced.append((rank, float(far.mean()),
                              float(np.median(t[far] - starts[0])) * 1e-9))
    return Placement(step_col, outside, _time_base_warnings(misplaced, tolerance_ns))


def _time_base_warnings(misplaced: list[tuple[int, float, float]], tolerance_ns: int,
                        ) -> list[str]:
    """One warning naming the ranks whose kernels and steps disagree on the time base."""
    warnings = []
    if misplaced:
        shown = ", ".join(f"{r} ({share:.0%}, {offset:+.3g} s)" for r, share, offset in
                          misplaced[:5])
        more = f" and {len(misplaced) - 5} more" if len(misplaced) > 5 else ""
        warnings.append(
            f"kernel and step times disagree on {len(misplaced)} rank(s): {shown}{more} of "
            f"their kernels fall more than {tolerance_ns / 1e9:g} s outside every step (share, "
            f"median offset from the step start). CUPTI start_ns and step t_ns must share one "
            f"time base (CLOCK_REALTIME); these kernels are left out of L3.")
    return warnings


def device_starts(kernels: KernelTable, placement: Placement, matrix: StepMatrix) -> np.ndarray:
    """(ranks x steps) start of each step's first kernel on its rank's clock, -1 where none."""
    out = np.full((len(matrix.ranks), len(matrix.steps)), -1, dtype=np.int64)
    placed = (placement.step_col >= 0) & ~placement.outside
    if not placed.any():
        return out
    row = np.searchsorted(matrix.ranks, kernels.rank[placed])
    flat = row * len(matrix.steps) + placement.step_col[placed]
    first = np.full(out.size, np.iinfo(np.int64).max)
    np.minimum.at(first, flat, kernels.start_ns[placed])
    seen = first < np.iinfo(np.int64).max
    out.ravel()[seen] = first[seen]
    return out
