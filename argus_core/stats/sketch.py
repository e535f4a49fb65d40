"""Duration sketches: per-group fine log histograms that absorb kernel batches in fixed memory.

A :class:`DurationSketch` keeps, for every group (one kernel on one stream of one rank in one
window), the exact count, sum, minimum, maximum and the first two moments of ln(duration),
plus a histogram of ln(duration) on one global grid of bins ``BIN_WIDTH`` wide (0.2% of the
duration). Each group stores only the bins between its own smallest and largest duration,
so memory follows how spread a kernel's durations are, not how many executions a window
holds: the processor can absorb a window of any length batch by batch and still cluster it
at the end (``argus_core.stats.compress.compress_sketch``).

Bins are laid out group after group in one flat array. A batch is binned with one
``floor`` and added with one ``np.add.at``; only when a group's range grows is the layout
rebuilt (with slack, so this happens a handful of times per group and window).
"""

from __future__ import annotations

import numpy as np

BIN_WIDTH = 1.0 / 512
"""Width of a histogram bin in ln(duration): 0.195% of the duration."""

_SLACK_BINS = 16  # extra bins each side when a group's range grows, plus a quarter of its
# width: a kernel's extremes creep outwards as a window fills, and each growth costs a copy


_BINCOUNT_RATIO = 64  # a full-length bincount beats np.add.at down to 1 event per 64 bins
_KEY_BITS = 41  # durations below 2**41 ns (36 minutes) pack with their group into one int64


def group_extremes(group: np.ndarray, dur: np.ndarray, n_groups: int,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the smallest and largest duration (inf / -inf for an empty group).

    One sort of (group, duration) packed into an int64 gives both: the first and last entry
    of each group's run. That is 3-4x cheaper than ``np.minimum.at`` plus ``np.maximum.at``
    on a million events; the ufunc path stays for durations too long or too fractional to
    pack.
    """
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    if len(group) == 0:
        return lo, hi
    whole = dur.astype(np.int64)
    if (n_groups < 2 ** (62 - _KEY_BITS) and float(dur.max()) < 2 ** _KEY_BITS
            and np.array_equal(whole, dur)):
        packed = np.sort((group << _KEY_BITS) | whole)
        owner = packed >> _KEY_BITS
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        ends = np.r_[starts[1:], len(packed)] - 1
        mask = (1 << _KEY_BITS) - 1
        lo[owner[starts]] = packed[starts] & mask
        hi[owner[starts]] = packed[ends] & mask
        return lo, hi
    np.minimum.at(lo, group, dur)
    np.maximum.at(hi, group, dur)
    return lo, hi


class DurationSketch:
    """Exact per-group moments and a fine log histogram of durations, grown batch by batch."""

    def __init__(self) -> None:
        self.count = np.zeros(0, dtype=np.int64)
        self.sum_ns = np.zeros(0, dtype=np.float64)
        self.sum_x = np.zeros(0, dtype=np.float64)  # sum of ln(duration)
        self.sum_x2 = np.zeros(0, dtype=np.float64)
        self.min_ns = np.zeros(0, dtype=np.float64)
        self.max_ns = np.zeros(0, dtype=np.float64)
        self.first_bin = np.zeros(0, dtype=np.int64)  # global bin index of each group's bin 0
        self.size = np.zeros(0, dtype=np.int64)  # bins held per group
        self.offset = np.zeros(1, dtype=np.int64)  # group g: bins[offset[g]:offset[g+1]]
        self.bins = np.zeros(0, dtype=np.int32)  # < 2**31 per bin and window: ample

    @classmethod
    def of(cls, group: np.ndarray, dur_ns: np.ndarray, n_groups: int | None = None,
           ) -> DurationSketch:
        """A sketch of one batch (dense group ids, durations in ns)."""
        sketch = cls()
        sketch.add(group, dur_ns, n_groups)
        return sketch

    @property
    def n_groups(self) -> int:
        """Number of groups (ids 0..n_groups-1; a group may have no events)."""
        return len(self.count)

    @property
    def nbytes(self) -> int:
        """Memory held by the sketch's arrays."""
        arrays = (self.count, self.sum_ns, self.sum_x, self.sum_x2, self.min_ns, self.max_ns,
                  self.first_bin, self.size, self.offset, self.bins)
        return sum(a.nbytes for a in arrays)

    def add(self, group: np.ndarray, dur_ns: np.ndarray, n_groups: int | None = None) -> None:
        """Absorb a batch: ``group`` holds dense group ids (new ids extend the sketch) and
        ``dur_ns`` the durations (0 counts as 1 ns in the histogram, as measured in the sum)."""
        group = np.asarray(group, dtype=np.int64)
        raw = np.asarray(dur_ns, dtype=np.float64)
        dur = np.maximum(raw, 1.0)
        if len(group) != len(dur):
            raise ValueError(f"group and dur_ns differ in length: {len(group)} != {len(dur)}")
        wanted = max(n_groups or 0, int(group.max()) + 1 if len(group) else 0)
        if wanted > self.n_groups:
            self._grow_groups(wanted)
        if len(group) == 0:
            return
        if int(group.min()) < 0:
            raise ValueError("group ids must be >= 0")
        x = np.log(dur)
        n = self.n_groups
        self.count += np.bincount(group, minlength=n)
        self.sum_ns += np.bincount(group, raw, minlength=n)  # exact, as measured
        self.sum_x += np.bincount(group, x, minlength=n)
        self.sum_x2 += np.bincount(group, x * x, minlength=n)
        lo, hi = group_extremes(group, dur, n)
        np.minimum(self.min_ns, lo, out=self.min_ns)
        np.maximum(self.max_ns, hi, out=self.max_ns)
        self._fit_ranges()
        fine = np.floor(x * (1.0 / BIN_WIDTH)).astype(np.int64)
        fine -= self.first_bin[group]
        fine += self.offset[group]
        if _BINCOUNT_RATIO * len(fine) >= len(self.bins):  # ~6 ns per bin vs ~0.5 us per event
            self.bins += np.bincount(fine, minlength=len(self.bins)).astype(np.int32)
        else:
            np.add.at(self.bins, fine, 1)

    def _grow_groups(self, n: int) -> None:
        extra = n - self.n_groups
        for name, fill in (("count", 0), ("sum_ns", 0.0), ("sum_x", 0.0), ("sum_x2", 0.0),
                           ("min_ns", np.inf), ("max_ns", -np.inf), ("first_bin", 0),
                           ("size", 0)):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.full(extra, fill, dtype=old.dtype)]))
        self.offset = np.concatenate([self.offset, np.full(extra, self.offset[-1])])

    def _fit_ranges(self) -> None:
        """Widen the groups whose [min, max] left their bin range, moving the bins held."""
        present = self.count > 0
        need_lo = np.zeros(self.n_groups, dtype=np.int64)
        need_hi = np.zeros(self.n_groups, dtype=np.int64)  # exclusive
        need_lo[present] = self.bin_of(self.min_ns[present])
        need_hi[present] = self.bin_of(self.max_ns[present]) + 1
        end = self.first_bin + self.size
        grow = present & ((need_lo < self.first_bin) | (need_hi > end) | (self.size == 0))
        if not grow.any():
            return
        held = self.size > 0
        lo = np.where(held, np.minimum(need_lo, self.first_bin), need_lo)
        hi = np.where(held, np.maximum(need_hi, end), need_hi)
        slack = _SLACK_BINS + (hi - lo) // 4
        lo = np.where(grow, lo - slack, self.first_bin)
        hi = np.where(grow, hi + slack, end)
        lo = np.maximum(lo, 0)  # durations >= 1 ns: ln >= 0
        size = hi - lo
        offset = np.zeros(self.n_groups + 1, dtype=np.int64)
        np.cumsum(size, out=offset[1:])
        bins = np.zeros(int(offset[-1]), dtype=np.int32)
        if len(self.bins):
            owner = np.repeat(np.arange(self.n_groups), self.size)
            moved = np.arange(len(self.bins)) - self.offset[owner] + (
                offset[owner] + self.first_bin[owner] - lo[owner])
            bins[moved] = self.bins
        self.first_bin, self.size, self.offset, self.bins = lo, size, offset, bins

    @staticmethod
    def bin_of(dur_ns: np.ndarray) -> np.ndarray:
        """Global bin index of durations (>= 1 ns)."""
        return np.floor(np.log(dur_ns) * (1.0 / BIN_WIDTH)).astype(np.int64)

    def occupied(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Non-empty bins in layout order (by group, then duration): (group, global bin, count)."""
        where = np.flatnonzero(self.bins)
        owner = np.searchsorted(self.offset, where, side="right") - 1
        return owner, where - self.offset[owner] + self.first_bin[owner], self.bins[where]


class BatchSketch:
    """The sketch of one whole batch, held sparsely: only the bins its durations occupy.

    Same statistics as :class:`DurationSketch` (exact count, sum, extremes, log moments, the
    same 0.2%-wide bins), for compressing a table that is all there at once (``argus
    diagnose``, the benchmarks). One sort of (group, duration) yields the extremes and the
    occupied bins as runs, instead of laying out every bin between each group's extremes
    (often several bins per event). It cannot absorb more batches: the processor, which
    gets a window piece by piece, uses ``DurationSketch``.
    """

    def __init__(self, group: np.ndarray, dur_ns: np.ndarray, n_groups: int | None = None):
        group = np.asarray(group, dtype=np.int64)
        raw = np.asarray(dur_ns, dtype=np.float64)
        if len(group) != len(raw):
            raise ValueError(f"group and dur_ns differ in length: {len(group)} != {len(raw)}")
        if len(group) and int(group.min()) < 0:
            raise ValueError("group ids must be >= 0")
        n = max(n_groups or 0, int(group.max()) + 1 if len(group) else 0)
        owner, dur = _sorted_by_group(group, np.maximum(raw, 1.0))
        # float32 logs: 1e-7 relative error against bins 2e-3 wide, at half the cost
        x = np.log(dur.astype(np.float32)).astype(np.float64)
        self.count = np.bincount(owner, minlength=n).astype(np.int64)
        self.sum_ns = np.bincount(group, raw, minlength=n)  # exact, as measured
        self.sum_x = np.bincount(owner, x, minlength=n)
        self.sum_x2 = np.bincount(owner, x * x, minlength=n)
        self.min_ns = np.full(n, np.inf)
        self.max_ns = np.full(n, -np.inf)
        fine = (x * (1.0 / BIN_WIDTH)).astype(np.int64)  # x >= 0: truncation is floor
        if len(owner):
            first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
            self.min_ns[owner[first]] = dur[first]
            self.max_ns[owner[first]] = dur[np.r_[first[1:], len(dur)] - 1]
        run = np.flatnonzero(np.r_[len(owner) > 0,
                                   (owner[1:] != owner[:-1]) | (fine[1:] != fine[:-1])])
        self._occupied = (owner[run], fine[run],
                          np.diff(np.r_[run, len(owner)]).astype(np.int64))

    @classmethod
    def of(cls, group: np.ndarray, dur_ns: np.ndarray, n_groups: int | None = None,
           ) -> BatchSketch:
        """The sketch of one batch (dense group ids, durations in ns)."""
        return cls(group, dur_ns, n_groups)

    @property
    def n_groups(self) -> int:
        """Number of groups (ids 0..n_groups-1; a group may have no events)."""
        return len(self.count)

    def occupied(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Non-empty bins in layout order (by group, then duration): (group, global bin, count)."""
        return self._occupied


def _sorted_by_group(group: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, duration) pairs sorted by group, then duration: one int64 sort when they pack."""
    if len(group) == 0:
        return group, dur
    whole = dur.astype(np.int64)
    if (int(group.max()) < 2 ** (62 - _KEY_BITS) and float(dur.max()) < 2 ** _KEY_BITS
            and np.array_equal(whole, dur)):
        packed = np.sort((group << _KEY_BITS) | whole)
        return packed >> _KEY_BITS, (packed & ((1 << _KEY_BITS) - 1)).astype(np.float64)
    order = np.lexsort((dur, group))
    return group[order], dur[order]
