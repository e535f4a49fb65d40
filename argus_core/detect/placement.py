"""Kernels into steps, rank by rank, and a check that kernels and steps share a time base.

Ranks' clocks differ by milliseconds and each rank starts its steps at its own time, so a
kernel is placed by its own rank's step starts (``steps.step_start_ns``), never by a job-wide
one. CUPTI timestamps and the steps' ``t_ns`` must be on the same clock (CLOCK_REALTIME);
kernels falling outside every step of their rank by more than a tolerance mean they are not
(a TSC time base, a wrong clock), and are reported.
"""

from __future__ import annotations

import itertools
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
    row_of = {int(r): i for i, r in enumerate(matrix.ranks.tolist())}
    order = np.argsort(kernels.rank, kind="stable")
    ranks_sorted = kernels.rank[order]
    bounds = np.flatnonzero(np.r_[True, ranks_sorted[1:] != ranks_sorted[:-1], True])
    end_s = np.nan_to_num(matrix.wall, nan=0.0)
    misplaced: list[tuple[int, float, float]] = []
    for lo, hi in itertools.pairwise(bounds):
        rank = int(ranks_sorted[lo])
        row = row_of.get(rank)
        if row is None:
            continue
        idx = order[lo:hi]
        recorded = np.flatnonzero(matrix.start_ns[row] >= 0)
        if len(recorded) == 0:
            continue
        starts = matrix.start_ns[row, recorded]
        ends = starts + (end_s[row, recorded] * 1e9).astype(np.int64)
        t = kernels.start_ns[idx]
        pos = np.searchsorted(starts, t, side="right") - 1
        inside = pos >= 0
        step_col[idx[inside]] = recorded[pos[inside]]
        late = (pos == len(recorded) - 1) & (t > ends[-1] + tolerance_ns)
        far = (t < starts[0] - tolerance_ns) | late  # gaps between steps (evaluation) are fine
        outside[idx] = far
        if far.mean() > TIME_BASE_SHARE:
            offset = float(np.median(t[far] - starts[np.clip(pos[far], 0, None)])) * 1e-9
            misplaced.append((rank, float(far.mean()), offset))
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
    return Placement(step_col, outside, warnings)


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
